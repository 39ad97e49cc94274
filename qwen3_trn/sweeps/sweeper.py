"""The project's Hydra sweeper: Hydra's grid (its basic sweeper), with every job checked before
any starts and a sweep directory that resumes.

- **Preflight.** Before the first job starts or is submitted, every job of the sweep is composed,
  typed and checked here, in the parent (``preflight.prepare``: ranges, inputs, the launcher's
  own checks, the fit check). If any is invalid nothing starts: exit 2, one paragraph per invalid
  job (its overrides and its problems). ``sweep.skip_invalid=true`` runs the valid ones and
  records the others as skipped. A job whose settings do not apply to its mode or model
  (``NotApplicable``) is not invalid: it is skipped when its turn comes, as before.
- **Seeds.** ``sweep.seeds=N`` runs every job N times, with ``training.seed`` = the configured
  seed, +1, ... +N-1 (its own init and data order; ``training.seed=<s>`` is one of the job's
  overrides, so a replicate is a job like any other: named, checked, resumed by it). The jobs
  go seed after seed, so a rerun with more seeds keeps the jobs (and numbers) of those run.
- **Plans.** When every job is ``mode=plan``, one table of all jobs (layout, memory per rank,
  fits, FLOPs per step) is printed and written to ``<sweep dir>/plan.txt``; no job runs.
- **Resume.** Rerunning a sweep into its directory (``hydra.sweep.dir=<existing>``) runs only
  the jobs that did not complete. A job is known by its overrides. A completed (or skipped) job
  is kept; one still queued or running on a cluster is left to run; a failed, interrupted or
  died one (its process gone: ``records.settle_died``) runs again, its earlier directory
  moved to ``<sweep dir>/previous-attempts/`` (nothing is overwritten) and, where that attempt saved a checkpoint, resumed from it.
"""

from __future__ import annotations

import io
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf, open_dict
from rich.console import Console
from rich.table import Table

from qwen3_trn.checkpointing import find_resume_point
from qwen3_trn.common.errors import ConfigError, ConfigErrors, NotApplicable
from qwen3_trn.common.redact import redact_overrides
from qwen3_trn.config.composition import composition_error
from qwen3_trn.config.overrides import SEED_KEY, SEEDS_KEY, override_key
from qwen3_trn.config.schema import Mode
from qwen3_trn.config.typed import run_config_from_container
from qwen3_trn.launch import Launcher, build_launcher
from qwen3_trn.plan import config_differences, render_plan
from qwen3_trn.results.records import (
    ATTEMPTS_DIR,
    IN_FLIGHT_STATUSES,
    PLAN_TEXT_FILE,
    RunStatus,
    scrub_hydra_files,
    write_job_record,
    write_text_atomic,
)
from qwen3_trn.run.preflight import Prepared, prepare
from qwen3_trn.sweeps.sweep import collect_jobs, job_name, settle_jobs, start_sweep_record, swept_keys, write_manifest

# Statuses of a job that a rerun of its sweep keeps: it ran to its end, or does not apply.
KEPT_STATUSES = (RunStatus.completed, RunStatus.skipped, RunStatus.planned)


@dataclass
class JobCheck:
    """One job of the sweep and what preflight found."""

    num: int
    overrides: list[str]
    config: DictConfig | None = None  # as Hydra composed it for the job, its hydra node included
    prepared: Prepared | None = None
    launcher: Launcher | None = None
    problem: ConfigError | None = None

    @property
    def invalid(self) -> bool:
        return self.problem is not None and not isinstance(self.problem, NotApplicable)

    def label(self) -> str:
        return f"#{self.num} {' '.join(redact_overrides(self.overrides)) or '(no overrides)'}"


def _problem_paragraphs(problem: ConfigError) -> str:
    errors = problem.errors if isinstance(problem, ConfigErrors) else [problem]
    return "\n".join(f"    {error}" for error in errors)


def invalid_jobs_message(invalid: list[JobCheck], total: int) -> str:
    paragraphs = "\n\n".join(f"  {job.label()}:\n{_problem_paragraphs(job.problem)}" for job in invalid)
    return (
        f"{len(invalid)} of {total} jobs of this sweep are invalid; nothing was started:\n\n{paragraphs}\n\n"
        "Fix them, or add sweep.skip_invalid=true to run the valid jobs and record these as skipped."
    )


def _gib(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} GiB"


def plan_table(checks: list[JobCheck]) -> str:
    """Every job of a planned sweep in one table: layout, memory per rank, fits, FLOPs per step."""
    table = Table(title="planned sweep", show_lines=False)
    for column in ("job", "overrides", "world", "layout", "memory per rank", "device memory", "fits", "TFLOP per step"):
        table.add_column(column, overflow="fold")
    for job in checks:
        overrides = " ".join(redact_overrides(job.overrides))
        if job.prepared is None:
            table.add_row(str(job.num), overrides, "-", f"skipped: {job.problem}", "", "", "", "")
            continue
        prepared, fit = job.prepared, job.prepared.fit
        training = prepared.cfg.training
        tokens = training.local_batch_size * training.seq_len * prepared.layout.data_parallel
        table.add_row(
            str(job.num),
            overrides,
            f"{prepared.layout.nnodes} x {prepared.layout.nproc_per_node}",
            prepared.layout.degrees(),
            f"{fit.decisive.total / 2**30:.2f} GiB",
            f"{fit.budget.per_rank / 2**30:.2f} GiB",
            "yes" if fit.fits else "NO",
            f"{fit.counts.flops_per_token * tokens * 1e-12:,.3f}",
        )
    console = Console(width=160, record=True, file=io.StringIO())
    console.print(table)
    return console.export_text()


def job_plan(job: JobCheck, swept: list[str]) -> tuple[str, dict[str, Any]]:
    """A planned job's own plan (as ``mode=plan`` prints it for one run, less its files) and
    what the manifest records of it; no run directory is written for it."""
    record: dict[str, Any] = {
        "num": job.num,
        "name": job_name(job.overrides, swept, job.num),
        "overrides": redact_overrides(job.overrides),
    }
    if job.prepared is None:
        return f"skipped: {job.problem}\n", {**record, "status": RunStatus.skipped, "reason": str(job.problem)}
    prepared = job.prepared
    launch = job.launcher.describe(prepared, Path(prepared.cfg.output_dir))
    HydraConfig.instance().set_config(job.config)  # the job's own Hydra settings, as when it runs
    differences = config_differences(OmegaConf.structured(prepared.cfg), swept)
    plan = {
        "world_size": prepared.layout.world_size,
        "layout": prepared.layout.describe(),
        "where": launch.where,
        "submission": launch.submission,
        "differences": differences[2],
        "fit": prepared.fit.to_record(),
    }
    return render_plan(prepared, launch, differences, None), {**record, "status": "planned", "plan": plan}


class CheckedSweeper(BasicSweeper):
    """Hydra's basic (grid) sweeper with sweep preflight, a table for planned sweeps and
    resumable sweep directories (module docstring). Chosen in ``conf/config.yaml``
    (``override hydra/sweeper: qwen3_trn``; registered in ``qwen3_trn.config.store``)."""

    def sweep(self, arguments: list[str]) -> Any:
        assert self.config is not None and self.launcher is not None and self.hydra_context is not None
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        overrides = parser.parse_overrides([*self._parse_config(), *arguments])
        jobs = [list(job) for batch in self.split_arguments(overrides, None) for job in batch]
        jobs = self._replicated(jobs, overrides)
        sweep_dir = Path(str(self.config.hydra.sweep.dir)).resolve()
        previous = self._previous_jobs(sweep_dir)
        checks = [self._check(num, job, sweep_dir) for num, job in enumerate(jobs)]

        invalid = [job for job in checks if job.invalid]
        skip_invalid = bool(OmegaConf.select(self.config, "sweep.skip_invalid", default=False))
        if invalid and not skip_invalid:
            print(f"error: {invalid_jobs_message(invalid, len(checks))}", file=sys.stderr, flush=True)
            sys.exit(2)

        start_sweep_record(self.config, resumed=bool(previous))
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        scrub_hydra_files(sweep_dir)
        if checks and all(job.prepared is None or job.prepared.cfg.mode == Mode.plan for job in checks):
            self._plan(checks, sweep_dir)
            return []
        for job in invalid:
            self._record_skipped(job, sweep_dir)

        to_run: list[tuple[int, list[str]]] = []
        for job in checks:
            if job.invalid:
                continue
            earlier = previous.get(job_identity(redact_overrides(job.overrides)))
            status = (earlier or {}).get("status")
            if status in KEPT_STATUSES or status in IN_FLIGHT_STATUSES:
                print(f"[sweep] #{job.num} {status} earlier, kept: {' '.join(redact_overrides(job.overrides))}", flush=True)
                continue
            extra = self._set_aside(earlier, job, sweep_dir) if earlier else []
            to_run.append((job.num, [*job.overrides, *extra]))
        return self._launch(to_run)

    def _replicated(self, jobs: list[list[str]], overrides: list[Any]) -> list[list[str]]:
        """Each job once per seed of ``sweep.seeds`` (module docstring): every job with the first
        seed, then every job with the next."""
        seeds = OmegaConf.select(self.config, SEEDS_KEY, default=1)
        problems = seeds_problems(overrides, seeds)
        if problems:
            print("error: " + "\n".join(problems), file=sys.stderr, flush=True)
            sys.exit(2)
        if seeds == 1:
            return jobs
        base = int(OmegaConf.select(self.config, SEED_KEY, default=0))
        # seed after seed: more seeds later append jobs, and the earlier ones keep their numbers
        return [[*job, f"{SEED_KEY}={base + i}"] for i in range(seeds) for job in jobs]

    def _plan(self, checks: list[JobCheck], sweep_dir: Path) -> None:
        """The table of all jobs (printed), each job's plan after it (in ``plan.txt``), and the
        manifest; nothing runs."""
        table = plan_table(checks)
        swept = swept_keys(self.config)
        plans, jobs = [], []
        for job in checks:
            text, record = job_plan(job, swept)
            plans.append(f"=== job {job.label()} ===\n{text}")
            jobs.append(
                {**record, **({"plan": {**record["plan"], "plan_file": str(sweep_dir / PLAN_TEXT_FILE)}} if "plan" in record else {})}
            )
        write_text_atomic(sweep_dir / PLAN_TEXT_FILE, "\n".join([table, *plans]))
        print(table, end="", flush=True)
        print(f"each job's plan: {sweep_dir / PLAN_TEXT_FILE}", flush=True)
        write_manifest(sweep_dir, jobs, {"complete": True, "planned": True})

    # --- preflight ------------------------------------------------------------------------

    def _check(self, num: int, overrides: list[str], sweep_dir: Path) -> JobCheck:
        job = JobCheck(num=num, overrides=overrides)
        try:
            config = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
        except Exception as exc:  # noqa: BLE001 - Hydra's and OmegaConf's composition errors
            job.problem = composition_error(exc)
            return job
        with open_dict(config):
            config.hydra.job.num = num
            config.output_dir = str(sweep_dir / str(config.hydra.sweep.subdir))
        job.config = config
        try:
            plain = OmegaConf.to_container(config, resolve=True)
            plain.pop("hydra", None)
            cfg = run_config_from_container(plain, check_ranges=False)  # among preflight's checks
            job.launcher = build_launcher(cfg.launcher)
            job.prepared = prepare(cfg, ranks_here=job.launcher.ranks_here, check_launcher=job.launcher.validate, shared_dir=str(sweep_dir))
        except ConfigError as exc:
            job.problem = exc
        except Exception as exc:  # noqa: BLE001 - e.g. an interpolation OmegaConf cannot resolve
            job.problem = composition_error(exc)
        return job

    # --- resume ---------------------------------------------------------------------------

    @staticmethod
    def _previous_jobs(sweep_dir: Path) -> dict[tuple[str, ...], dict[str, Any]]:
        """The jobs an earlier run of this sweep recorded, by their overrides (in-flight states
        brought up to date by their launcher), without the resume point a rerun added."""
        if not sweep_dir.is_dir():
            return {}
        jobs = settle_jobs(collect_jobs(sweep_dir))
        return {job_identity(job.get("overrides", [])): job for job in jobs}

    @staticmethod
    def _set_aside(earlier: dict[str, Any], job: JobCheck, sweep_dir: Path) -> list[str]:
        """Move a failed or interrupted attempt's directory aside; the overrides that resume
        the job from its checkpoint, where it saved one."""
        run_dir = Path(earlier.get("run_dir") or "")
        if not run_dir.is_dir() or sweep_dir not in run_dir.parents:
            return []
        attempts = sweep_dir / ATTEMPTS_DIR
        attempts.mkdir(exist_ok=True)
        n = 1
        while (attempts / f"{run_dir.name}-{n}").exists():
            n += 1
        moved = run_dir.rename(attempts / f"{run_dir.name}-{n}")
        print(f"[sweep] #{job.num} {earlier.get('status')} earlier: runs again; the earlier attempt is in {moved}", flush=True)
        checkpoint = job.prepared.cfg.checkpoint if job.prepared else None
        if checkpoint is None or not checkpoint.enable:
            return []
        try:
            find_resume_point(moved, checkpoint.folder)
        except ConfigError:  # no complete checkpoint: start over
            return []
        print(f"[sweep] #{job.num} resumes from its checkpoint in {moved}", flush=True)
        return [f"checkpoint.resume_from={moved}"]

    def _record_skipped(self, job: JobCheck, sweep_dir: Path, why: str = "sweep.skip_invalid=true") -> None:
        job_dir = Path(job.prepared.cfg.output_dir) if job.prepared else sweep_dir / str(job.num)
        record = {
            "num": job.num,
            "name": job_name(job.overrides, swept_keys(self.config), job.num),
            "overrides": redact_overrides(job.overrides),
            "run_dir": str(job_dir),
            "status": RunStatus.skipped,
            "invalid": True,
            "reason": f"{job.problem} ({why})",
            "error_key": job.problem.key,
        }
        write_job_record(job_dir, record)
        print(f"[sweep] #{job.num} skipped, invalid: {job.problem}", flush=True)

    # --- launch ---------------------------------------------------------------------------

    def _launch(self, jobs: Sequence[tuple[int, list[str]]]) -> list[Any]:
        """Launch the jobs keeping their numbers (and so their directories): each run of
        consecutive numbers in one call of the launcher, so it may run them concurrently."""
        returns, batch, first = [], [], None
        for num, overrides in [*jobs, (None, None)]:
            if batch and (num is None or num != first + len(batch)):
                results = self.launcher.launch(batch, initial_job_idx=first)
                for result in results:
                    _ = result.return_value  # raises where a job failed outside run_sweep_job
                returns.append(results)
                batch = []
            if num is not None:
                first = num if not batch else first
                batch.append(overrides)
        return returns


def seeds_problems(overrides: list[Any], seeds: Any) -> list[str]:
    """Why ``sweep.seeds`` cannot replicate this sweep's jobs (parsed overrides), if it cannot."""
    swept = {o.get_key_element().lstrip("+~") for o in overrides if o.is_sweep_override()}
    if SEEDS_KEY in swept:
        return [f"{SEEDS_KEY}: give one number of seeds (e.g. {SEEDS_KEY}=3), not a list."]
    if not isinstance(seeds, int) or isinstance(seeds, bool) or seeds < 1:
        return [f"{SEEDS_KEY}={seeds}: give how many seeds each job runs with, 1 or more (e.g. {SEEDS_KEY}=3)."]
    if seeds > 1 and SEED_KEY in swept:
        return [
            f"{SEED_KEY}: swept together with {SEEDS_KEY}={seeds}; sweep the seeds one way: "
            f"{SEEDS_KEY}=N (seeds {SEED_KEY}, +1, ...) or a list of {SEED_KEY} values."
        ]
    return []


def job_identity(overrides: list[str]) -> tuple[str, ...]:
    """What a rerun of the sweep knows a job by: its overrides, less the resume point a rerun
    added and how many seeds the sweep had (a rerun with more seeds keeps the seeds run)."""
    return tuple(o for o in overrides if not _added_by_resume(o) and override_key(o) != SEEDS_KEY)


def _added_by_resume(override: str) -> bool:
    return override_key(override) == "checkpoint.resume_from" and f"/{ATTEMPTS_DIR}/" in override


__all__ = ["CheckedSweeper", "JobCheck", "invalid_jobs_message", "plan_table", "seeds_problems"]
