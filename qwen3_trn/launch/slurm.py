"""``launcher=slurm``: one Slurm job per run, submitted through submitit.

The project's own launcher on top of submitit's ``SlurmExecutor`` (not Hydra's submitit launcher
plugin): the job receives the already composed, validated ``<run dir>/config.yaml`` and never
re-runs Hydra, and submitit's checkpoint/requeue hook (``SlurmTrainJob.checkpoint``) is where a
preempted or timed-out job is resubmitted to resume from its last torchtitan checkpoint.

- Before submitting (``check_cluster``, called by ``preflight.prepare``): Slurm's commands on PATH,
  the controller answering ``sinfo``, and ``launcher.partition`` among its partitions.
- ``launch_slurm``: ``sbatch`` through submitit with ``--nodes=N --ntasks-per-node=1`` (one
  elastic agent per node); the job's files (sbatch script, pickles, logs) are in
  ``<run dir>/slurm``. ``launcher.wait=true`` follows the log and returns the job's end state;
  false prints the job id and returns, with ``summary.json`` saying ``submitted``.
- On each node, ``SlurmTrainJob`` starts the node's ranks: in-process for a single rank, else
  PyTorch's elastic launcher with c10d rendezvous on the first node of the job (run id
  ``slurm-<job id>``), exactly like torchrun.
- Preemption or a time limit: Slurm sends USR2, submitit calls ``SlurmTrainJob.checkpoint``
  (which resubmits the same call) and requeues the job; the run directory's
  ``checkpoint/step-N`` makes torchtitan resume there, and the wandb run (id fixed in
  ``tracking.json``) is continued with ``WANDB_RESUME=allow``.
- ``python -m qwen3_trn.launch.slurm status <run or sweep dir>...`` reads the jobs' states from
  Slurm (squeue, then sacct) into ``summary.json`` / ``job.json`` / the sweep manifest.

submitit is imported only when a job is submitted or runs (``pip install 'qwen3_trn[slurm]'``).
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterable

from qwen3_trn.errors import ConfigError

SLURM_FOLDER = "slurm"
SUMMARY_FILE = "summary.json"
# Set inside a Slurm job: preflight then skips the submission checks (sinfo, partition).
ON_NODE_ENV = "QWEN3_TRN_SLURM_NODE"
COMMANDS = ("sbatch", "sinfo", "srun", "sacct", "squeue")
DEFAULT_SLURM_CONF = "/etc/slurm/slurm.conf"

# Slurm job state -> the run's status.
_PENDING = {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING", "RESV_DEL_HOLD", "SUSPENDED", "STOPPED", "SPECIAL_EXIT"}
_RUNNING = {"RUNNING", "COMPLETING", "SIGNALING", "STAGE_OUT", "RESIZING"}
_FAILED = {"FAILED", "TIMEOUT", "NODE_FAIL", "BOOT_FAIL", "OUT_OF_MEMORY", "DEADLINE", "PREEMPTED", "REVOKED"}
FINAL_STATUSES = ("completed", "failed", "cancelled")
IN_FLIGHT_STATUSES = ("submitted", "pending", "running")


def status_of(state: str) -> str | None:
    """``pending``/``running``/``completed``/``failed``/``cancelled`` for a Slurm state (None: unknown yet)."""
    state = (state or "").split()[0].rstrip("+") if state else ""
    if not state:
        return None
    if state == "COMPLETED":
        return "completed"
    if state == "CANCELLED":
        return "cancelled"
    if state in _RUNNING:
        return "running"
    if state in _PENDING:
        return "pending"
    if state in _FAILED:
        return "failed"
    return None


class SlurmJobEnded(SystemExit):
    """A waited-for Slurm job that did not complete (exit status 1; the message is printed first).

    ``run_status`` (failed or cancelled) is what ``summary.json`` records."""

    def __init__(self, run_status: str) -> None:
        super().__init__(1)
        self.run_status = run_status


# ------------------------------------------------------------------------------------------
# Config checks (no cluster needed) and the submission's parameters
# ------------------------------------------------------------------------------------------


def time_minutes(value: Any) -> int:
    """Minutes of a Slurm time limit: ``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``, ``D-HH:MM:SS``."""
    text = str(value).strip()
    match = re.fullmatch(r"(?:(\d+)-)?(\d+(?::\d+){0,2})", text)
    if not match:
        raise ConfigError("launcher.time", f"'{text}' is not a Slurm time limit; use minutes (60), HH:MM:SS (4:00:00) or D-HH:MM:SS (1-12:00:00).")
    days, rest = match.group(1), [int(p) for p in match.group(2).split(":")]
    if days is not None:
        hours, minutes, seconds = (rest + [0, 0])[:3]
        total = int(days) * 86400 + hours * 3600 + minutes * 60 + seconds
    elif len(rest) == 3:
        total = rest[0] * 3600 + rest[1] * 60 + rest[2]
    elif len(rest) == 2:
        total = rest[0] * 60 + rest[1]
    else:
        total = rest[0] * 60
    if total < 60:
        raise ConfigError("launcher.time", f"'{text}' is under one minute; give the job at least 1 minute (10 or more to be requeued on preemption, see README).")
    return math.ceil(total / 60)


def check_config(cfg) -> None:
    """Checks of the launcher=slurm keys that need no cluster (also in mode=plan)."""
    launcher = cfg.launcher
    time_minutes(launcher.time)
    for key in ("cpus_per_task", "gpus_per_node"):
        value = getattr(launcher, key)
        if value is not None and value < 1:
            raise ConfigError(f"launcher.{key}", f"must be >= 1 (or null for Slurm's default), got {value}.")
    if launcher.mem_gb is not None and launcher.mem_gb <= 0:
        raise ConfigError("launcher.mem_gb", f"must be > 0 (or null for Slurm's default), got {launcher.mem_gb}.")
    if launcher.max_requeues < 0:
        raise ConfigError("launcher.max_requeues", f"must be >= 0, got {launcher.max_requeues}.")
    if launcher.signal_delay_s < 0:
        raise ConfigError("launcher.signal_delay_s", f"must be >= 0, got {launcher.signal_delay_s}.")
    if launcher.rdzv_backend != "c10d":
        raise ConfigError("launcher.rdzv_backend", f"launcher=slurm starts ranks with c10d rendezvous on the job's first node; got '{launcher.rdzv_backend}'.")
    for key in launcher.env:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(key)):
            raise ConfigError("launcher.env", f"'{key}' is not a valid environment variable name.")


def _slurm_conf_text() -> str:
    conf = os.environ.get("SLURM_CONF")
    if conf:
        return f"SLURM_CONF={conf}"
    return f"SLURM_CONF unset (Slurm then reads {DEFAULT_SLURM_CONF} or asks DNS in configless mode)"


def _how_looked() -> str:
    return f"looked for {', '.join(COMMANDS)} on PATH={os.environ.get('PATH', '')} and for the cluster config in {_slurm_conf_text()}"


def partitions() -> tuple[dict[str, int], str | None]:
    """The cluster's partitions with their node counts (``sinfo -h -o %P|%D``) and the default
    one; ConfigError when no Slurm is reachable, saying how it was looked for."""
    missing = [name for name in COMMANDS if shutil.which(name) is None]
    if missing:
        raise ConfigError(
            "launcher",
            f"launcher=slurm, but no Slurm is reachable: {', '.join(missing)} not found ({_how_looked()}). "
            "Submit from a Slurm login node, put Slurm's commands on PATH, or set SLURM_CONF; to try it on one "
            "machine see launchers/slurm/README.md (local_cluster.sh).",
        )
    conf = os.environ.get("SLURM_CONF")
    if conf and not Path(conf).is_file():
        raise ConfigError("launcher", f"launcher=slurm, but SLURM_CONF={conf} does not exist ({_how_looked()}); point SLURM_CONF at the cluster's slurm.conf or unset it.")
    try:
        done = subprocess.run(["sinfo", "-h", "-o", "%P|%D"], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        raise ConfigError("launcher", f"launcher=slurm, but `sinfo` got no answer from the Slurm controller in 30 s ({_how_looked()}).") from None
    if done.returncode != 0:
        reason = (done.stderr or done.stdout).strip().splitlines()
        raise ConfigError(
            "launcher",
            f"launcher=slurm, but `sinfo` could not reach the Slurm controller ({reason[-1] if reason else f'exit {done.returncode}'}); {_how_looked()}.",
        )
    nodes: dict[str, int] = {}
    default = None
    for line in done.stdout.splitlines():
        name, _, count = line.strip().partition("|")
        if name.endswith("*"):
            name = name[:-1]
            default = name
        if name:
            nodes[name] = nodes.get(name, 0) + (int(count) if count.strip().isdigit() else 0)
    return nodes, default


def check_cluster(cfg, nnodes: int) -> None:
    """Before submitting: Slurm is reachable, knows ``launcher.partition`` and has the nodes."""
    nodes, default = partitions()
    partition = cfg.launcher.partition
    if partition is not None and partition not in nodes:
        shown = ", ".join(f"{n} (default)" if n == default else n for n in nodes) or "none"
        raise ConfigError("launcher.partition", f"'{partition}' is not a partition of this Slurm cluster ({_slurm_conf_text()}); `sinfo` lists: {shown}.")
    if partition is None and default is None and nodes:
        raise ConfigError("launcher.partition", f"this Slurm cluster has no default partition; choose one of {', '.join(nodes)}.")
    chosen = partition or default
    if chosen in nodes and 0 < nodes[chosen] < nnodes:
        key = "launcher.nodes" if cfg.launcher.nodes is not None else "launcher.nnodes"
        raise ConfigError(key, f"{nnodes} nodes were asked for, but partition {chosen} has {nodes[chosen]}; ask for at most {nodes[chosen]} or choose another launcher.partition.")


def _project_root() -> Path | None:
    """The directory holding the qwen3_trn package when it is not installed in site-packages."""
    root = Path(__file__).resolve().parents[2]
    return None if root.name in ("site-packages", "dist-packages") else root


def setup_lines(cfg) -> list[str]:
    """Shell lines of the sbatch script before the job starts: the user's ``launcher.setup``,
    then ``launcher.env`` (e.g. the trn2 presets' Neuron/EFA variables) and the job's own."""
    lines = [str(line) for line in cfg.launcher.setup]
    root = _project_root()
    if root is not None:
        lines.append(f"export PYTHONPATH={shlex.quote(str(root))}${{PYTHONPATH:+:$PYTHONPATH}}")
    lines += [f"export {key}={shlex.quote(str(value))}" for key, value in cfg.launcher.env.items()]
    lines += [
        "# a requeued job continues its wandb run (same id, from tracking.json)",
        "export WANDB_RESUME=allow",
    ]
    return lines


def _mem(mem_gb: float) -> str:
    return f"{int(mem_gb)}GB" if mem_gb == int(mem_gb) else f"{int(mem_gb * 1024)}MB"


def job_name(cfg) -> str:
    if cfg.launcher.job_name:
        return cfg.launcher.job_name
    run_dir = Path(cfg.output_dir)
    return "qwen3_trn-" + (cfg.run_name or f"{run_dir.parent.name}-{run_dir.name}")


def sbatch_parameters(cfg, nnodes: int) -> dict[str, Any]:
    """submitit ``SlurmExecutor`` parameters (sbatch's names) for this run."""
    launcher = cfg.launcher
    params: dict[str, Any] = {
        "job_name": job_name(cfg),
        "time": time_minutes(launcher.time),
        "nodes": nnodes,
        "ntasks_per_node": 1,
        "signal_delay_s": launcher.signal_delay_s,
        "setup": setup_lines(cfg),
    }
    optional = {
        "partition": launcher.partition,
        "cpus_per_task": launcher.cpus_per_task,
        "gpus_per_node": launcher.gpus_per_node,
        "mem": _mem(launcher.mem_gb) if launcher.mem_gb else None,
        "account": launcher.account,
        "qos": launcher.qos,
        "constraint": launcher.constraint,
    }
    params.update({k: v for k, v in optional.items() if v is not None})
    if launcher.slurm_additional_parameters:
        params["additional_parameters"] = dict(launcher.slurm_additional_parameters)
    return params


def python_command(cfg) -> str:
    return cfg.launcher.python or shlex.quote(sys.executable)


def submitit_command(cfg, folder: Path) -> str:
    """What the sbatch script runs on each node (submitit's ``_submitit_command_str``)."""
    return " ".join([python_command(cfg), "-u -m submitit.core._submit", shlex.quote(str(folder))])


def sbatch_script(cfg, nnodes: int, folder: Path) -> str:
    """The sbatch script submitit writes for this run (rendered here without submitting)."""
    from submitit.slurm.slurm import _make_sbatch_string

    return _make_sbatch_string(command=submitit_command(cfg, folder), folder=folder, **sbatch_parameters(cfg, nnodes))


def rendezvous_port(job_id: str) -> int:
    """The c10d port on the first node of a multi-node job: from the job id, so that jobs sharing
    a node do not collide (``launcher.rdzv_endpoint`` overrides it)."""
    digits = re.sub(r"\D", "", str(job_id)) or "0"
    return 20000 + int(digits) % 10000


def where(cfg, nnodes: int) -> str:
    launcher = cfg.launcher
    parts = [f"Slurm partition {launcher.partition}" if launcher.partition else "Slurm (the cluster's default partition)",
             f"{nnodes} node(s) x 1 task", f"time {launcher.time} ({time_minutes(launcher.time)} min)"]
    for key in ("account", "qos", "constraint", "cpus_per_task", "gpus_per_node", "mem_gb"):
        if getattr(launcher, key) is not None:
            parts.append(f"{key} {getattr(launcher, key)}")
    return ", ".join(parts)


def plan_section(prepared, run_dir: Path) -> str:
    """``mode=plan``: where the job would run and the exact submission, without submitting."""
    from qwen3_trn.plan import torchrun_command

    cfg = prepared.cfg
    layout = prepared.layout
    folder = Path(run_dir).resolve() / SLURM_FOLDER
    config_path = Path(run_dir).resolve() / "config.yaml"
    try:
        script = sbatch_script(cfg, layout.nnodes, folder)
    except ImportError:
        script = "(submitit is not installed here: pip install 'qwen3_trn[slurm]' to render the script)\n" + json.dumps(sbatch_parameters(cfg, layout.nnodes), indent=1)
    if layout.world_size == 1:
        ranks = "a single rank: SlurmTrainJob runs the worker in the job's own process (no rendezvous)"
    else:
        endpoint = cfg.launcher.rdzv_endpoint or ("127.0.0.1:<free port>" if layout.nnodes == 1 else "<first node of SLURM_JOB_NODELIST>:<20000 + job id % 10000>")
        launcher = replace(cfg.launcher, rdzv_endpoint=endpoint, rdzv_id="slurm-$SLURM_JOB_ID")
        ranks = "each node's elastic agent starts its ranks like:\n" + torchrun_command(replace(prepared, cfg=replace(cfg, launcher=launcher)), config_path)
    return "\n".join([
        f"where: {where(cfg, layout.nnodes)}",
        f"sbatch script (submitit writes it to {folder}/<job id>_submission.sh and submits it with sbatch):",
        script.rstrip(),
        "",
        f"submitit runs qwen3_trn.launch.slurm.SlurmTrainJob('{config_path}') on each node: {ranks}",
        f"logs: {folder}/<job id>_<node>_log.out / .err; states: python -m qwen3_trn.launch.slurm status {Path(run_dir).resolve()}",
    ])


# ------------------------------------------------------------------------------------------
# The run's files
# ------------------------------------------------------------------------------------------


class _Unreadable(Exception):
    pass


def _load_summary(run_dir: Path, tries: int = 40) -> dict[str, Any]:
    """summary.json; {} when there is none. Other writers (the metrics rank, the submitting
    process) rewrite it in place, so a half-written file is read again; ``_Unreadable`` if it
    stays unparseable."""
    path = Path(run_dir) / SUMMARY_FILE
    for _ in range(tries):
        try:
            if not path.is_file():
                return {}
            return json.loads(path.read_text())
        except (OSError, ValueError):
            time.sleep(0.05)
    raise _Unreadable(str(path))


def read_summary(run_dir: Path) -> dict[str, Any]:
    try:
        return _load_summary(run_dir)
    except _Unreadable:
        return {}


def update_summary(run_dir: Path, **fields: Any) -> dict[str, Any]:
    """Merge ``fields`` into summary.json (the ``slurm`` section key by key); atomic replace.
    A file that cannot be read is left alone rather than replaced by ``fields`` alone."""
    try:
        summary = _load_summary(run_dir)
    except _Unreadable:
        return {}
    slurm = fields.pop("slurm", None)
    summary.update(fields)
    if slurm is not None:
        summary["slurm"] = {**(summary.get("slurm") or {}), **slurm}
    path = Path(run_dir) / SUMMARY_FILE
    tmp = path.with_name(f".{SUMMARY_FILE}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(summary, indent=2, default=str) + "\n")
    os.replace(tmp, path)
    return summary


# ------------------------------------------------------------------------------------------
# Submitting, and waiting
# ------------------------------------------------------------------------------------------


def launch_slurm(job) -> str:
    """``LAUNCHERS["slurm"]``: submit the run as one Slurm job; wait for it if asked.

    Returns the run's status: ``submitted`` (no wait, or a sweep, which waits at its end),
    or ``completed``; a failed or cancelled job raises ``SlurmJobEnded``."""
    from qwen3_trn.sweep import in_multirun

    try:
        import submitit
    except ImportError:
        raise ConfigError("launcher", "launcher=slurm submits through submitit, which is not installed: pip install 'qwen3_trn[slurm]' (or pip install submitit).") from None

    cfg = job.cfg
    run_dir = Path(cfg.output_dir).resolve()
    folder = run_dir / SLURM_FOLDER
    params = sbatch_parameters(cfg, job.layout.nnodes)
    executor = submitit.SlurmExecutor(folder=folder, max_num_timeout=cfg.launcher.max_requeues, python=python_command(cfg))
    executor.update_parameters(**params)
    try:
        submitted = executor.submit(SlurmTrainJob(str(run_dir / "config.yaml")))
    except submitit.core.utils.FailedJobError as exc:
        raise ConfigError("launcher", f"sbatch refused the job: {str(exc).strip()[-1500:]}") from None
    job_id = str(submitted.job_id)
    stdout = [str(submitit.core.utils.JobPaths(folder, job_id, task).stdout) for task in range(job.layout.nnodes)]
    stderr = [str(submitit.core.utils.JobPaths(folder, job_id, task).stderr) for task in range(job.layout.nnodes)]
    info = {
        "job_id": job_id,
        "state": "PENDING",
        "partition": cfg.launcher.partition,
        "nodes": job.layout.nnodes,
        "folder": str(folder),
        "submission_file": str(submitted.paths.submission_file),
        "stdout": stdout[0],
        "stderr": stderr[0],
        "logs": stdout + stderr,
        "submitted": time.time(),
    }
    update_summary(run_dir, status="submitted", slurm=info)
    wait = cfg.launcher.wait and not in_multirun()
    print(f"[slurm] submitted job {job_id} ({where(cfg, job.layout.nnodes)})", flush=True)
    print(f"[slurm]   log: {stdout[0]}\n[slurm]   err: {stderr[0]}", flush=True)
    if not wait:
        if not in_multirun():
            print(f"[slurm]   state: python -m qwen3_trn.launch.slurm status {run_dir}   (cancel: scancel {job_id})", flush=True)
        return "submitted"
    return wait_for_run(run_dir)


def _print_new(path: Path, offset: int) -> int:
    try:
        with path.open("rb") as f:
            f.seek(offset)
            chunk = f.read()
    except OSError:
        return offset
    if chunk:
        sys.stdout.write(chunk.decode(errors="replace"))
        sys.stdout.flush()
    return offset + len(chunk)


def wait_for_run(run_dir: Path, poll: float = 2.0, follow: bool = True) -> str:
    """Follow the job's log until Slurm says it ended; ``completed``, else ``SlurmJobEnded``."""
    run_dir = Path(run_dir)
    info = read_summary(run_dir).get("slurm") or {}
    job_id = info["job_id"]
    log = Path(info["stdout"])
    offset = 0
    seen = None
    try:
        while True:
            state = query_states([job_id]).get(job_id, "")
            if follow:
                offset = _print_new(log, offset)
            if state and state != seen:
                print(f"[slurm] job {job_id}: {state}", flush=True)
                seen = state
            status = status_of(state)
            if status in FINAL_STATUSES:
                break
            time.sleep(poll)
    except KeyboardInterrupt:
        print(f"\n[slurm] stopped waiting; job {job_id} goes on (state: python -m qwen3_trn.launch.slurm status {run_dir}; "
              f"cancel: scancel {job_id})", flush=True)
        return "submitted"
    if follow:
        _print_new(log, offset)
    refresh_runs([run_dir])
    if status == "completed":
        return "completed"
    error = read_summary(run_dir).get("job_error") or job_error(Path(info["stderr"]))
    print(f"error: Slurm job {job_id} ended {state}" + (f": {error}" if error else "") + f"\n  log: {info['stderr']}", file=sys.stderr, flush=True)
    raise SlurmJobEnded(status)


# ------------------------------------------------------------------------------------------
# States: squeue for live jobs, sacct for ended ones
# ------------------------------------------------------------------------------------------


def query_states(job_ids: Iterable[str]) -> dict[str, str]:
    """Slurm state of each job: sacct's end state once it has one (a requeued job's last run),
    else squeue's while it is queued or running (sacct shows RUNNING only seconds after the
    start), else sacct's."""
    ids = [str(i) for i in job_ids if i]
    if not ids:
        return {}
    states: dict[str, str] = {}
    try:
        done = subprocess.run(["sacct", "-n", "-X", "-P", "-j", ",".join(ids), "-o", "JobID,State"], capture_output=True, text=True, timeout=60)
        for line in done.stdout.splitlines():
            if "|" in line:
                job_id, state = line.split("|", 1)
                if job_id in ids and state.strip():
                    states[job_id] = state.split()[0]
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        done = subprocess.run(["squeue", "-h", "-j", ",".join(ids), "-o", "%i|%T"], capture_output=True, text=True, timeout=60)
        for line in done.stdout.splitlines():
            if "|" in line:
                job_id, state = line.strip().split("|", 1)
                # sacct's end state wins over squeue's COMPLETING (processes still exiting)
                if job_id in ids and state.strip() and status_of(states.get(job_id, "")) not in FINAL_STATUSES:
                    states[job_id] = state.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    for job_id in (i for i in ids if i not in states):  # no accounting: slurmctld keeps ended jobs MinJobAge s
        try:
            done = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, timeout=60)
            match = re.search(r"\bJobState=(\S+)", done.stdout)
            if match:
                states[job_id] = match.group(1)
        except (OSError, subprocess.SubprocessError):
            pass
    return states


def job_error(stderr: Path) -> str | None:
    """The last exception line of a job's stderr log (e.g. ``KeyError: 'text'``)."""
    try:
        lines = stderr.read_text(errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        text = re.sub(r"^\[rank\d+\]:\s*", "", line.strip())
        if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Failure)\b", text) or text.startswith("torch.distributed.elastic"):
            return text[:500]
    return None


def refresh_runs(run_dirs: Iterable[Path]) -> list[dict[str, Any]]:
    """Read the Slurm state of each run's job into its summary.json and job.json (a sweep job);
    returns the updated summaries (runs without a Slurm job are left out)."""
    runs = [(Path(d), read_summary(Path(d))) for d in run_dirs]
    runs = [(d, s) for d, s in runs if (s.get("slurm") or {}).get("job_id")]
    states = query_states(s["slurm"]["job_id"] for _, s in runs)
    out = []
    for run_dir, summary in runs:
        job_id = summary["slurm"]["job_id"]
        state = states.get(job_id)
        status = status_of(state or "")
        fields: dict[str, Any] = {}
        if state and state != summary["slurm"].get("state"):
            fields["slurm"] = {"state": state}
        if status is not None and status != summary.get("status"):
            fields["status"] = status
        if status == "failed" and not summary.get("error"):
            reason = summary.get("job_error") or job_error(Path(summary["slurm"].get("stderr", "")))
            fields["error"] = f"Slurm job {job_id} {state}" + (f": {reason}" if reason else "")
        # written only on a change: the job's node writes this file too
        summary = update_summary(run_dir, **fields) if fields else summary
        _update_job_record(run_dir, summary)
        out.append(summary)
    return out


def _update_job_record(run_dir: Path, summary: dict[str, Any]) -> dict[str, Any] | None:
    """A sweep job's job.json, brought in line with its run's summary."""
    from qwen3_trn.sweep import ERROR_LOG, JOB_FILE, rerun_command

    path = run_dir / JOB_FILE
    try:
        record = json.loads(path.read_text()) if path.is_file() else None
    except (OSError, ValueError):
        record = None
    if record is None:
        return None
    _merge_into_record(record, summary)
    if record["status"] == "failed":
        record["rerun"] = rerun_command(record.get("overrides", []))
        (run_dir / ERROR_LOG).write_text(f"job {record.get('num')}: {' '.join(record.get('overrides', []))}\n{record.get('error')}\n"
                                         f"Slurm logs: {', '.join((summary.get('slurm') or {}).get('logs', []))}\n")
    path.write_text(json.dumps(record, indent=2, default=str) + "\n")
    return record


def _merge_into_record(record: dict[str, Any], summary: dict[str, Any]) -> None:
    from qwen3_trn.sweep import _final_figures

    slurm = summary.get("slurm") or {}
    record["slurm"] = slurm
    status = summary.get("status") or record.get("status")
    record["status"] = status
    record["log"] = slurm.get("stderr") if status == "failed" else slurm.get("stdout")
    final = _final_figures(summary)
    if final:
        record["final"] = final
    if status == "failed":
        record["error"] = summary.get("error") or f"Slurm job {slurm.get('job_id')} {slurm.get('state')}"
    else:
        record.pop("error", None)
    if summary.get("wandb_run_id"):
        record["wandb_run_id"] = summary["wandb_run_id"]


def settle_sweep_jobs(jobs: list[dict[str, Any]], wait: bool = False, poll: float = 3.0, timeout: float | None = None) -> list[dict[str, Any]]:
    """The sweep manifest's Slurm jobs with their current states (waiting until every one has
    ended when ``wait``); their job.json files are updated too."""
    slurm_jobs = [j for j in jobs if (j.get("slurm") or {}).get("job_id") and j.get("run_dir")]
    if not slurm_jobs:
        return jobs
    deadline = None if timeout is None else time.monotonic() + timeout
    reported: dict[str, str] = {}
    while True:
        summaries = {s.get("slurm", {}).get("job_id"): s for s in refresh_runs(Path(j["run_dir"]) for j in slurm_jobs)}
        for job in slurm_jobs:
            summary = summaries.get(job["slurm"]["job_id"])
            if summary is not None:
                _merge_into_record(job, summary)
            if wait and reported.get(job["slurm"]["job_id"]) != job["status"]:
                reported[job["slurm"]["job_id"]] = job["status"]
                print(f"[slurm] sweep job #{job.get('num')} (Slurm job {job['slurm']['job_id']}): {job['status']}", flush=True)
        if not wait or all(j.get("status") not in IN_FLIGHT_STATUSES for j in slurm_jobs):
            return jobs
        if deadline is not None and time.monotonic() > deadline:
            return jobs
        time.sleep(poll)


# ------------------------------------------------------------------------------------------
# In the job, on each node
# ------------------------------------------------------------------------------------------


_TERM_RECEIVED: list[float] = []


def _record_sigterm(previous: Any = None) -> Any:
    """Note SIGTERM (Slurm's first signal on scancel, and on a preemption that sends no user
    signal first), then call ``previous`` (submitit's handler, which ignores it: the requeue
    comes with USR2). Returns the handler it chains to."""
    previous = previous if previous is not None else signal.getsignal(signal.SIGTERM)

    def on_term(signum, frame):
        _TERM_RECEIVED.append(time.time())
        if callable(previous):
            previous(signum, frame)

    try:
        signal.signal(signal.SIGTERM, on_term)
    except ValueError:  # not the main thread
        pass
    return previous


def _stopped_by_slurm(exc: BaseException) -> bool:
    """The ranks ended because Slurm is stopping the job: SIGTERM reached this process, or the
    elastic agent turned it into its SignalException (it takes SIGTERM over while it runs)."""
    return bool(_TERM_RECEIVED) or type(exc).__name__ == "SignalException"


class SlurmTrainJob:
    """What submitit runs on each node of the job: this node's ranks of the run.

    A submitit checkpointable callable (``checkpoint`` below, like
    ``submitit.helpers.Checkpointable`` but without importing submitit here): on preemption or
    time-out submitit calls ``checkpoint``, which resubmits the same call, and requeues the job.
    The requeued job starts the ranks again in the same run directory, where torchtitan finds
    ``checkpoint/step-N`` and resumes from it."""

    def __init__(self, config_path: str) -> None:
        self.config_path = str(config_path)
        self.run_dir = str(Path(config_path).parent)

    def __call__(self) -> dict[str, Any]:
        import submitit

        from qwen3_trn.rank import load_run_config

        env = submitit.JobEnvironment()
        lead = env.global_rank == 0
        os.environ[ON_NODE_ENV] = "1"
        os.environ["QWEN3_TRN_LAUNCH_TIME"] = str(time.time())
        submitit_term = _record_sigterm()
        cfg = load_run_config(self.config_path)
        os.environ.update({key: str(value) for key, value in cfg.launcher.env.items()})
        run_dir = Path(self.run_dir)
        restarts = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
        if lead:
            update_summary(run_dir, status="running", slurm={"state": "RUNNING", "job_id": str(env.job_id), "hostnames": env.hostnames, "restarts": restarts, "started": time.time()})
        try:
            from qwen3_trn.preflight import prepare
            from qwen3_trn.worker import WorkerJob

            prepared = prepare(cfg)
            self._run_ranks(WorkerJob(cfg=cfg, device_type=prepared.device.type, layout=prepared.layout), env)
        except Exception as exc:
            if _stopped_by_slurm(exc):
                # Slurm is stopping this job (scancel, or a preemption whose USR2 comes next) and
                # the ranks died of its SIGTERM: wait for submitit's requeue (USR2, which exits
                # from here) or Slurm's SIGKILL, rather than reporting a failure.
                _record_sigterm(submitit_term)
                time.sleep(90)
            if lead:
                from qwen3_trn.sweep import describe_error

                update_summary(run_dir, status="failed", job_error=describe_error(exc), slurm={"state": "FAILED", "ended": time.time()})
            raise
        if lead:
            if restarts:
                _resummarize(run_dir)
            update_summary(run_dir, status="completed", slurm={"state": "COMPLETED", "ended": time.time()})
        return {"run_dir": str(run_dir), "node": env.node}

    @staticmethod
    def _run_ranks(job, env) -> None:
        from qwen3_trn.launch.local import launch_local

        launcher = job.cfg.launcher
        if job.layout.world_size > 1:
            endpoint = launcher.rdzv_endpoint
            if endpoint is None and job.layout.nnodes > 1:
                endpoint = f"{env.hostnames[0]}:{rendezvous_port(env.job_id)}"
            launcher = replace(launcher, rdzv_endpoint=endpoint, rdzv_id=launcher.rdzv_id or f"slurm-{env.job_id}")
            job = replace(job, cfg=replace(job.cfg, launcher=launcher))
        launch_local(job)

    def checkpoint(self, *args: Any, **kwargs: Any):
        """submitit's requeue hook (USR2: preemption or time limit): resubmit this same call."""
        from submitit.helpers import DelayedSubmission

        try:
            summary = read_summary(Path(self.run_dir))
            requeues = int((summary.get("slurm") or {}).get("requeues", 0)) + 1
            update_summary(Path(self.run_dir), status="pending", slurm={"state": "REQUEUED", "requeues": requeues, "requeued": time.time()})
        except OSError:
            pass
        return DelayedSubmission(self, *args, **kwargs)


def _resummarize(run_dir: Path) -> None:
    """After a resumed run: the summary over the whole metrics.jsonl (every step once, the
    latest record of a step logged again after the resume)."""
    from qwen3_trn.run_summary import summarize

    path = run_dir / "metrics.jsonl"
    by_step: dict[int, dict[str, Any]] = {}
    try:
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            by_step[int(record["step"])] = record
    except OSError:
        return
    if by_step:
        update_summary(run_dir, **summarize([by_step[s] for s in sorted(by_step)]))


# ------------------------------------------------------------------------------------------
# python -m qwen3_trn.launch.slurm status <dir>...
# ------------------------------------------------------------------------------------------


def _run_dirs_of(path: Path) -> tuple[list[Path], bool]:
    """Run directories under ``path`` (itself, or a sweep's jobs) and whether it is a sweep."""
    from qwen3_trn.sweep import MANIFEST_FILE, SWEEP_FILE

    if (path / SUMMARY_FILE).is_file():
        return [path], False
    is_sweep = (path / SWEEP_FILE).is_file() or (path / MANIFEST_FILE).is_file()
    return sorted({p.parent for p in path.glob(f"**/{SUMMARY_FILE}")}), is_sweep


def refresh_sweep(sweep_dir: Path, wait: bool = False) -> dict[str, Any]:
    """Refresh a sweep's Slurm jobs and rewrite its manifest (and its report once all ended)."""
    from qwen3_trn.sweep import collect_jobs, write_manifest

    jobs = settle_sweep_jobs(collect_jobs(sweep_dir), wait=wait)
    in_flight = any(j.get("status") in IN_FLIGHT_STATUSES for j in jobs)
    previous = {}
    try:
        previous = json.loads((sweep_dir / "manifest.json").read_text())
    except (OSError, ValueError):
        pass
    extra = {"complete": not in_flight}
    if not in_flight and previous.get("report"):
        extra["report"] = previous["report"]
    manifest = write_manifest(sweep_dir, jobs, extra)
    if not in_flight and not previous.get("report"):
        try:
            from qwen3_trn.report import build_report

            result = build_report([sweep_dir], out_dir=sweep_dir)
            manifest = write_manifest(sweep_dir, jobs, {**extra, "report": str(result.html), "report_notes": result.notes})
        except Exception as exc:  # noqa: BLE001 - the states matter more than the report
            manifest = write_manifest(sweep_dir, jobs, {**extra, "report_error": f"{type(exc).__name__}: {exc}"})
    return manifest


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m qwen3_trn.launch.slurm", description="Slurm jobs of qwen3_trn runs and sweeps.")
    sub = parser.add_subparsers(dest="command", required=True)
    status = sub.add_parser("status", help="read the jobs' Slurm states into summary.json / job.json / the sweep manifest")
    status.add_argument("dirs", nargs="+", help="run directories or sweep directories")
    status.add_argument("--wait", action="store_true", help="wait until every job has ended")
    status.add_argument("--json", action="store_true", help="print the states as JSON")
    args = parser.parse_args(argv)

    rows = []
    for given in args.dirs:
        path = Path(given).resolve()
        if not path.is_dir():
            parser.error(f"{given} is not a directory")
        run_dirs, is_sweep = _run_dirs_of(path)
        if is_sweep:
            manifest = refresh_sweep(path, wait=args.wait)
            rows += [{"run_dir": j.get("run_dir"), "status": j.get("status"), "job_id": (j.get("slurm") or {}).get("job_id"),
                      "state": (j.get("slurm") or {}).get("state"), "log": j.get("log"), "num": j.get("num")} for j in manifest["jobs"]]
            continue
        while True:
            summaries = refresh_runs(run_dirs)
            if not args.wait or all(s.get("status") not in IN_FLIGHT_STATUSES for s in summaries):
                break
            time.sleep(3)
        rows += [{"run_dir": s.get("run_dir"), "status": s.get("status"), "job_id": s["slurm"].get("job_id"), "state": s["slurm"].get("state"),
                  "log": s["slurm"].get("stderr") if s.get("status") == "failed" else s["slurm"].get("stdout")} for s in summaries]
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        for row in rows:
            num = f"#{row['num']} " if row.get("num") is not None else ""
            print(f"{num}{row['status'] or '?':<10} job {row['job_id'] or '-':<8} {row['state'] or '':<11} {row['run_dir']}  log: {row['log']}")
    return 1 if any(r["status"] in ("failed", "cancelled") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
