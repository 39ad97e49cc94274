"""A submitted run's Slurm job: its state and error as submitit reports them, into the run's
summary, and following it to its end.

States come from submitit's job object (``submitit.SlurmJob``: sacct behind it), the error of
a failed job from the exception submitit pickled for it. Every fact of the job goes into the
run's launcher-neutral ``job`` section through the launcher's ``record_job`` (``launcher``:
``SlurmLauncher``, whose ``refresh`` these functions are).
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterable

from qwen3_trn.launch.base import Launcher
from qwen3_trn.results.records import IN_FLIGHT_STATUSES, RunStatus, died_figures, job_section, read_summary

# Slurm job state -> the run's status.
_PENDING = {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING", "RESV_DEL_HOLD", "SUSPENDED", "STOPPED", "SPECIAL_EXIT"}
_RUNNING = {"RUNNING", "COMPLETING", "SIGNALING", "STAGE_OUT", "RESIZING"}
_FAILED = {"FAILED", "TIMEOUT", "BOOT_FAIL", "DEADLINE", "PREEMPTED", "REVOKED"}
# killed hard, with no chance to record an end: a lost node, the OOM killer
_DIED = {"NODE_FAIL", "OUT_OF_MEMORY"}
FINAL_STATUSES = (RunStatus.completed, RunStatus.failed, RunStatus.cancelled, RunStatus.died)


class SlurmJobEnded(SystemExit):
    """A waited-for Slurm job that did not complete (exit status 1; the message is printed first).

    ``run_status`` (failed, died or cancelled) is what ``summary.json`` records."""

    def __init__(self, run_status: RunStatus) -> None:
        super().__init__(1)
        self.run_status = run_status


def status_of(state: str) -> RunStatus | None:
    """The run's status for a Slurm state (None: not known to Slurm yet)."""
    state = state.split()[0].rstrip("+") if state and state.strip() else ""
    if state == "COMPLETED":
        return RunStatus.completed
    if state == "CANCELLED":
        return RunStatus.cancelled
    if state in _RUNNING:
        return RunStatus.running
    if state in _PENDING:
        return RunStatus.pending
    if state in _FAILED:
        return RunStatus.failed
    if state in _DIED:
        return RunStatus.died
    return None


def _job(job: dict[str, Any]):
    import submitit

    return submitit.SlurmJob(folder=job["folder"], job_id=str(job["id"]))


def job_state(job: dict[str, Any]) -> str:
    """Slurm's state of the run's job ("UNKNOWN" until the accounting knows it); the first word
    only (sacct says "CANCELLED by <uid>")."""
    return (_job(job).get_info(mode="force").get("State") or "UNKNOWN").split()[0]


def _last_line(text: str) -> str | None:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:500] if lines else None


def job_error(job: dict[str, Any]) -> str | None:
    """The last line of the error submitit pickled for the job (e.g. ``KeyError: 'text'``), else
    of its error log. A job that exited without pickling one (a pruned trial, a killed rank)
    has none to wait for: submitit's ``exception()`` would poll 15 s for it first."""
    submitted = _job(job)
    if not submitted.paths.result_pickle.exists():
        try:
            return _last_line(Path(job["stderr"]).read_text(errors="replace"))
        except (KeyError, OSError):
            return None
    error = submitted.exception()
    if error is None:
        return None
    return _last_line(str(error)) or type(error).__name__


def node_errors(job: dict[str, Any]) -> str | None:
    """Which nodes of a multi-node job failed and why, the cause first: a node whose ranks were
    killed by a signal, else the node that failed first (the others' ranks lost their peers)."""
    errors = job.get("node_errors") or {}
    if not errors:
        return None

    def killed(error: Any) -> bool:  # qwen3_trn.common.errors.describe_error's words, or torch elastic's
        return bool(re.search(r"killed by SIG|Signal \d+ \(SIG", str(error)))

    order = sorted(errors.items(), key=lambda item: (not killed(item[1].get("error")), item[1].get("time", 0)))
    return "; ".join(f"node {host} (#{info.get('node')}): {info.get('error')}" for host, info in order)[:1000]


def refresh_runs(launcher: type[Launcher], run_dirs: Iterable[Path]) -> list[dict[str, Any]]:
    """Read the Slurm state of each run's job into its summary.json; returns the summaries
    (runs without a job of ``launcher`` are left out)."""
    out = []
    for run_dir in map(Path, run_dirs):
        summary = read_summary(run_dir)
        job = job_section(summary)
        if job.get("launcher") != launcher.name or not job.get("id"):
            continue
        state = job_state(job)
        status = status_of(state)
        fields: dict[str, Any] = {}
        if status is not None and status != summary.get("status"):
            fields["status"] = status
        if status in (RunStatus.failed, RunStatus.died) and not summary.get("error"):
            reason = node_errors(job) or summary.get("job_error") or job_error(job)
            fields["error"] = f"Slurm job {job['id']} {state}" + (f": {reason}" if reason else "")
        if status == RunStatus.died and summary.get("status") != RunStatus.died:
            fields.update(died_figures(run_dir))
        changed = status is not None and state != job.get("state")
        out.append(launcher.record_job(run_dir, {"state": state} if changed else {}, **fields) if changed or fields else summary)
    return out


def cancel_runs(launcher: type[Launcher], run_dirs: Iterable[Path]) -> None:
    """``scancel`` the job of each run still in flight (its end state then comes from sacct)."""
    ids = []
    for run_dir in map(Path, run_dirs):
        summary = read_summary(run_dir)
        job = job_section(summary)
        if job.get("launcher") == launcher.name and job.get("id") and summary.get("status") in IN_FLIGHT_STATUSES:
            ids.append(str(job["id"]))
    if ids:
        result = subprocess.run(["scancel", *ids], capture_output=True, text=True, timeout=60)
        print(f"[slurm] cancelled job(s) {', '.join(ids)}" + (f": {result.stderr.strip()}" if result.returncode else ""), flush=True)


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


def wait_for_run(launcher: type[Launcher], run_dir: Path, poll: float = 2.0, follow: bool = True) -> RunStatus:
    """Follow the job's log until Slurm says it ended; ``completed``, else ``SlurmJobEnded``."""
    run_dir = Path(run_dir)
    job = job_section(read_summary(run_dir))
    job_id = job["id"]
    log = Path(job["stdout"])
    offset, seen, status = 0, None, None
    try:
        while status not in FINAL_STATUSES:
            state = job_state(job)
            if follow:
                offset = _print_new(log, offset)
            if state != seen:
                print(f"[slurm] job {job_id}: {state}", flush=True)
                seen = state
            status = status_of(state)
            if status not in FINAL_STATUSES:
                time.sleep(poll)
    except KeyboardInterrupt:
        print(
            f"\n[slurm] stopped waiting; job {job_id} goes on (state: python -m qwen3_trn.status {run_dir}; cancel: scancel {job_id})",
            flush=True,
        )
        return RunStatus.submitted
    if follow:
        _print_new(log, offset)
    refresh_runs(launcher, [run_dir])
    if status == RunStatus.completed:
        return status
    summary = read_summary(run_dir)
    error = node_errors(job_section(summary)) or summary.get("job_error") or job_error(job)
    print(
        f"error: Slurm job {job_id} ended {seen}" + (f": {error}" if error else "") + f"\n  log: {job['stderr']}",
        file=sys.stderr,
        flush=True,
    )
    raise SlurmJobEnded(status)


def wait_for_runs(launcher: type[Launcher], run_dirs: list[Path], poll: float = 3.0) -> list[dict[str, Any]]:
    """Refresh until every run's job has ended."""
    while True:
        summaries = refresh_runs(launcher, run_dirs)
        if all(s.get("status") not in IN_FLIGHT_STATUSES for s in summaries):
            return summaries
        time.sleep(poll)
