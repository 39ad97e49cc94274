"""What submitit runs on each node of a run's Slurm job: that node's ranks of the run.

``SlurmTrainJob`` is a submitit checkpointable callable (``checkpoint`` below, like
``submitit.helpers.Checkpointable``): on preemption or time-out Slurm sends USR2, submitit
calls ``checkpoint``, which resubmits the same call, and requeues the job. The requeued job
starts the ranks again in the same run directory, where torchtitan finds
``checkpoint/step-N`` and resumes from it; the wandb run (id fixed in ``tracking.json``) is
continued with ``WANDB_RESUME=allow``.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

from qwen3_trn.common.errors import RunInterrupted, describe_error
from qwen3_trn.common.redact import passed_env
from qwen3_trn.launch.base import Launcher
from qwen3_trn.launch.node import start_node_ranks, with_rendezvous
from qwen3_trn.launch.slurm.submission import rendezvous_port
from qwen3_trn.results.records import (
    CONFIG_FILE,
    LAUNCH_TIME_ENV,
    RunStatus,
    job_section,
    load_run_config,
    read_metrics,
    read_summary,
    summarize,
    update_summary,
)
from qwen3_trn.run.preflight import resolve
from qwen3_trn.run.trials import TrialPruned
from qwen3_trn.run.worker import WorkerJob


class TermWatch:
    """Notes SIGTERM (Slurm's first signal on scancel, and on a preemption that sends no user
    signal first), then calls the handler it replaced (submitit's, which ignores it: the
    requeue comes with USR2).

    torch elastic's agent takes SIGTERM over while it runs its ranks, so a SIGTERM that comes then
    is seen through Python's signal wakeup fd, which the interpreter writes every caught signal's
    number to, whichever handler runs: the agent may report its ranks' deaths (Slurm signals them
    too) before its own SignalException.

    ``requeue_signal`` (submitit's USR2) comes with a preemption's SIGTERM, in either order, and
    its handler runs ``scontrol requeue`` on the lead task (``runs_requeue``). A SIGTERM taken
    there would abandon the requeue: the agent's handler raises, and Slurm signals every process
    of the job step, that ``scontrol`` too. So the lead task ignores SIGTERM while the handler
    runs (an ignored signal stays ignored in the ``scontrol`` it starts), and it exits after;
    another task's handler only returns, and its SIGTERM is handled once it has."""

    def __init__(self, requeue_signal: signal.Signals = signal.SIGUSR2, runs_requeue: bool = True) -> None:
        self.received: list[float] = []
        self.previous = signal.getsignal(signal.SIGTERM)
        self.requeue_signal = requeue_signal
        self.runs_requeue = runs_requeue
        self.previous_requeue = signal.getsignal(requeue_signal)
        self._wakeup_r, self._wakeup_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            signal.signal(signal.SIGTERM, self._on_term)
            signal.signal(requeue_signal, self._on_requeue)
            self.previous_wakeup_fd = signal.set_wakeup_fd(self._wakeup_w, warn_on_full_buffer=False)
        except ValueError:  # not the main thread
            self.previous_wakeup_fd = None

    def _on_term(self, signum, frame) -> None:
        self.received.append(time.time())
        if callable(self.previous):
            self.previous(signum, frame)

    def _on_requeue(self, signum, frame) -> None:
        term_handler = signal.getsignal(signal.SIGTERM)
        held: list[float] = []
        signal.signal(signal.SIGTERM, signal.SIG_IGN if self.runs_requeue else lambda *_: held.append(time.time()))
        try:
            if callable(self.previous_requeue):
                self.previous_requeue(signum, frame)  # submitit's: requeues and exits, or returns
        finally:
            signal.signal(signal.SIGTERM, term_handler)
            self.received += held
        if held and callable(term_handler):
            term_handler(signal.SIGTERM, frame)

    def _caught_signals(self) -> bytes:
        caught = b""
        while True:
            try:
                chunk = os.read(self._wakeup_r, 512)
            except BlockingIOError:
                return caught
            if not chunk:
                return caught
            caught += chunk

    def watch_again(self) -> None:
        """SIGTERM to this watch again: torch elastic's agent leaves its raising handler in place
        when it ends. The requeue signal stays guarded."""
        signal.signal(signal.SIGTERM, self._on_term)

    def restore(self) -> None:
        signal.signal(signal.SIGTERM, self.previous)
        signal.signal(self.requeue_signal, self.previous_requeue)
        if self.previous_wakeup_fd is not None:
            signal.set_wakeup_fd(self.previous_wakeup_fd)

    def stopped_by_slurm(self, exc: BaseException) -> bool:
        """The ranks ended because Slurm is stopping the job: SIGTERM reached this process (through
        any handler), or the elastic agent turned it into its SignalException (the local launcher
        raises that as RunInterrupted)."""
        if signal.SIGTERM in self._caught_signals():
            self.received.append(time.time())
        return bool(self.received) or isinstance(exc, RunInterrupted) or type(exc).__name__ == "SignalException"


class SlurmTrainJob:
    """``launcher``: the class that submitted the job (``SlurmLauncher``), which records its facts."""

    def __init__(self, run_dir: str, launcher: type[Launcher]) -> None:
        self.run_dir = str(run_dir)
        self.launcher = launcher

    def __call__(self) -> dict[str, Any]:
        import submitit

        env = submitit.JobEnvironment()
        lead = env.global_rank == 0
        os.environ[LAUNCH_TIME_ENV] = str(time.time())
        term = TermWatch(getattr(signal, f"SIG{env.USR_SIG}"), runs_requeue=lead)  # submitit requeues from global rank 0
        cfg = load_run_config(Path(self.run_dir) / CONFIG_FILE)
        os.environ.update(passed_env(cfg.launcher.env))  # secrets came with the job's environment
        run_dir = Path(self.run_dir)
        restarts = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
        if lead:
            self.launcher.record_job(
                run_dir,
                {"state": "RUNNING", "id": str(env.job_id), "hostnames": env.hostnames, "restarts": restarts, "started": time.time()},
                status=RunStatus.running,
            )
        try:
            resolved = resolve(cfg)
            job = WorkerJob(cfg=cfg, device_type=resolved.device.type, layout=resolved.layout, backend=resolved.backend)
            if job.layout.world_size > 1:
                endpoint = f"{env.hostnames[0]}:{rendezvous_port(env.job_id)}" if job.layout.nnodes > 1 else None
                job = with_rendezvous(job, endpoint, f"slurm-{env.job_id}")
                if lead and job.layout.nnodes > 1:
                    self.launcher.record_job(run_dir, {"rendezvous": job.cfg.launcher.rdzv_endpoint})
            start_node_ranks(job)
        except (Exception, RunInterrupted) as exc:  # RunInterrupted: a KeyboardInterrupt, not an Exception
            if term.stopped_by_slurm(exc):
                # Slurm is stopping this job (scancel, or a preemption whose USR2 comes next) and
                # the ranks died of its SIGTERM: wait for submitit's requeue (USR2, which exits
                # from here, still under ``term``'s guard) or Slurm's SIGKILL, rather than
                # reporting a failure.
                term.watch_again()
                time.sleep(90)
            reason = describe_error(exc)
            if cfg.launcher.nnodes > 1:
                # which node failed and why: each node's own reason (the first to fail is the cause;
                # the others' ranks lost their peers)
                self.launcher.record_job(run_dir, {"node_errors": {env.hostname: {"node": env.node, "error": reason, "time": time.time()}}})
            if lead:
                self.launcher.record_job(run_dir, {"state": "FAILED", "ended": time.time()}, status=RunStatus.failed, job_error=reason)
            raise
        except TrialPruned:  # the run ended itself and recorded how (not submitit's requeue exit)
            if lead:
                self.launcher.record_job(run_dir, {"ended": time.time()})
            raise
        if lead:
            if restarts:  # the summary over every step once, after a resume
                update_summary(run_dir, **summarize(read_metrics(run_dir)))
            self.launcher.record_job(run_dir, {"state": "COMPLETED", "ended": time.time()}, status=RunStatus.completed)
        return {"run_dir": str(run_dir), "node": env.node}

    def checkpoint(self, *args: Any, **kwargs: Any):
        """submitit's requeue hook (USR2: preemption or time limit): resubmit this same call."""
        from submitit.helpers import DelayedSubmission

        requeues = int(job_section(read_summary(Path(self.run_dir))).get("requeues", 0)) + 1
        self.launcher.record_job(
            Path(self.run_dir), {"state": "REQUEUED", "requeues": requeues, "requeued": time.time()}, status=RunStatus.pending
        )
        return DelayedSubmission(self, *args, **kwargs)
