"""``launcher=slurm``: one Slurm job per run, submitted through submitit.

The project's own launcher on top of submitit's ``SlurmExecutor`` (not Hydra's submitit
launcher plugin): the job receives the already composed, validated ``<run dir>/config.yaml``
and never re-runs Hydra, and submitit's checkpoint/requeue hook is where a preempted or
timed-out job resumes from its last torchtitan checkpoint.

- ``submission``: checks before submitting, the sbatch parameters and script;
- ``state``: the job's state and error from submitit, into the run's summary; waiting;
- ``job``: what runs on each node (``SlurmTrainJob``).

``sbatch`` through submitit with ``--nodes=N --ntasks-per-node=1`` (one elastic agent per
node); the job's files (sbatch script, pickles, logs) are in ``<run dir>/slurm``.
``launcher.wait=true`` follows the log and returns the job's end state; false returns at once
with ``summary.json`` saying ``submitted``. The job's facts (id, state, logs, requeues, node
errors) are the run's launcher-neutral ``job`` section (``Launcher.record_job``). submitit
is imported only when a job is submitted or runs (``pip install 'qwen3_trn[slurm]'``).
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from qwen3_trn.common.errors import ConfigError
from qwen3_trn.config.option_schemas import SlurmLauncherConfig
from qwen3_trn.config.schema import Mode, RunConfig
from qwen3_trn.launch.base import LaunchDescription, Launcher
from qwen3_trn.launch.node import environment, torchrun_command
from qwen3_trn.launch.slurm.job import SlurmTrainJob
from qwen3_trn.launch.slurm.state import SlurmJobEnded, cancel_runs, refresh_runs, wait_for_run, wait_for_runs
from qwen3_trn.launch.slurm.submission import (
    check_cluster,
    check_config,
    python_command,
    sbatch_parameters,
    sbatch_script,
    secret_env,
    where,
)
from qwen3_trn.results.records import CONFIG_FILE, RunStatus
from qwen3_trn.run.layout import Layout
from qwen3_trn.run.preflight import Prepared
from qwen3_trn.titan import Trainer

__all__ = ["SLURM_DIR", "SlurmJobEnded", "SlurmLauncher", "SlurmTrainJob", "sbatch_script"]

# The run directory's folder of the job's files: sbatch script, submitit's pickles, logs.
SLURM_DIR = "slurm"


class SlurmLauncher(Launcher):
    ranks_here = False

    Config = SlurmLauncherConfig

    config: Config

    def validate(self, cfg: RunConfig, layout: Layout) -> None:
        check_config(cfg)
        if cfg.mode == Mode.train:
            check_cluster(cfg, layout.nnodes)  # Slurm reachable, the partition known, before anything is written

    def describe(self, prepared: Prepared, run_dir: Path) -> LaunchDescription:
        cfg, layout = prepared.cfg, prepared.layout
        run_dir = Path(run_dir).resolve()
        folder = run_dir / SLURM_DIR
        try:
            script = sbatch_script(cfg, layout.nnodes, folder)
        except ImportError:
            script = "(submitit is not installed here: pip install 'qwen3_trn[slurm]' to render the script)\n" + json.dumps(
                sbatch_parameters(cfg, layout.nnodes), indent=1
            )
        first_node = "<first node of SLURM_JOB_NODELIST>:<20000 + job id % 10000>"
        endpoint = self.config.rdzv_endpoint or ("127.0.0.1:<free port>" if layout.nnodes == 1 else first_node)
        node_launcher = replace(self.config, rdzv_endpoint=endpoint, rdzv_id=self.config.rdzv_id or "slurm-$SLURM_JOB_ID")
        torchrun = torchrun_command(node_launcher, layout, run_dir / CONFIG_FILE)
        if layout.world_size == 1:
            ranks = "a single rank: SlurmTrainJob runs the worker in the job's own process (no rendezvous)"
        else:
            ranks = "each node's elastic agent starts its ranks like:\n" + torchrun
        section = "\n".join(
            [
                f"where: {where(cfg, layout.nnodes)}",
                f"sbatch script (submitit writes it to {folder}/<job id>_submission.sh and submits it with sbatch):",
                script.rstrip(),
                "",
                f"submitit runs qwen3_trn.launch.slurm.SlurmTrainJob('{run_dir}', SlurmLauncher) on each node: {ranks}",
                f"logs: {folder}/<job id>_<node>_log.out / .err; states: python -m qwen3_trn.status {run_dir}",
            ]
        )
        return LaunchDescription(
            where=where(cfg, layout.nnodes), torchrun=torchrun, submission=script, sections={"Slurm submission (not submitted)": section}
        )

    def launch(self, prepared: Prepared, trainer_config: Trainer.Config | None = None, *, detach: bool = False) -> RunStatus:
        """Submit the run as one Slurm job; wait for it when ``launcher.wait`` and not
        ``detach``. Returns ``submitted`` or ``completed``; a failed or cancelled job raises
        ``SlurmJobEnded``."""
        try:
            import submitit
        except ImportError:
            raise ConfigError(
                "launcher",
                "launcher=slurm submits through submitit, which is not installed: pip install 'qwen3_trn[slurm]' (or pip install submitit).",
            ) from None

        cfg, layout = prepared.cfg, prepared.layout
        run_dir = Path(cfg.output_dir).resolve()
        folder = run_dir / SLURM_DIR
        executor = submitit.SlurmExecutor(folder=folder, max_num_timeout=self.config.max_requeues, python=python_command(cfg))
        executor.update_parameters(**sbatch_parameters(cfg, layout.nnodes))
        try:
            with environment(secret_env(cfg)):  # sbatch passes its environment on to the job
                submitted = executor.submit(SlurmTrainJob(str(run_dir), type(self)))
        except submitit.core.utils.FailedJobError as exc:
            raise ConfigError("launcher", f"sbatch refused the job: {str(exc).strip()[-1500:]}") from None
        job_id = str(submitted.job_id)
        paths = [submitit.core.utils.JobPaths(folder, job_id, task) for task in range(layout.nnodes)]
        stdout, stderr = [str(p.stdout) for p in paths], [str(p.stderr) for p in paths]
        info = {
            "id": job_id,
            "label": f"Slurm job {job_id}",
            "state": "PENDING",
            "partition": self.config.partition,
            "nodes": layout.nnodes,
            "folder": str(folder),
            "submission_file": str(submitted.paths.submission_file),
            "stdout": stdout[0],
            "stderr": stderr[0],
            "logs": stdout + stderr,
            "submitted": time.time(),
        }
        self.record_job(run_dir, info, status=RunStatus.submitted)
        print(f"[slurm] submitted job {job_id} ({where(cfg, layout.nnodes)})", flush=True)
        print(f"[slurm]   log: {stdout[0]}\n[slurm]   err: {stderr[0]}", flush=True)
        if detach or not self.waits_for_jobs:
            if not detach:
                print(f"[slurm]   state: python -m qwen3_trn.status {run_dir}   (cancel: scancel {job_id})", flush=True)
            return RunStatus.submitted
        return wait_for_run(type(self), run_dir)

    @property
    def waits_for_jobs(self) -> bool:
        """``launcher.wait``: follow the job to its end, else return once it is submitted."""
        return self.config.wait

    @classmethod
    def refresh(cls, run_dirs: list[Path], wait: bool = False) -> list[dict[str, Any]]:
        return wait_for_runs(cls, run_dirs) if wait else refresh_runs(cls, run_dirs)

    @classmethod
    def stop(cls, run_dirs: list[Path]) -> None:
        cancel_runs(cls, run_dirs)
