"""The local Slurm cluster (launchers/slurm/local_cluster.sh) against real Slurm daemons:
job states through sacct, partitions, submitit, and the requeue paths a resumable job relies on.

Skipped when the Slurm packages are missing (install: launchers/slurm/install_debian.sh).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from tests.slurm_cluster import SlurmCluster, slurm_cluster, slurm_env, wait_for_state  # noqa: F401

try:
    import cloudpickle
    import submitit
    from submitit.helpers import Checkpointable
except ImportError:  # the submitit tests skip
    submitit = None
    Checkpointable = object

pytestmark = pytest.mark.slow
needs_submitit = pytest.mark.skipif(submitit is None, reason="submitit is not installed (pip install submitit)")

if submitit is not None:
    # The job's Python cannot import this test module: send its functions and classes by value.
    cloudpickle.register_pickle_by_value(sys.modules[__name__])


# --------------------------------------------------------------------------------------------
# Plain Slurm: sbatch, sacct states, partitions


def sacct_fields(cluster: SlurmCluster, job: str, fields: str, expected: str, timeout: float = 15) -> str:
    """``sacct -X -P -o FIELDS`` for the job, polled until it reads ``expected``: slurmdbd fills in
    a job's record in steps (on a fresh cluster the first job shows no Partition for a second)."""
    deadline = time.monotonic() + timeout
    while True:
        got = cluster.run("sacct", "-n", "-X", "-P", "-j", job, "-o", fields).stdout.strip()
        if got == expected or time.monotonic() > deadline:
            return got
        time.sleep(0.25)


def test_partitions(slurm_cluster: SlurmCluster):
    """Both partitions up, and idle once no job runs (the session's cluster: an earlier test's
    job may still be ending when this one starts)."""
    deadline = time.monotonic() + 120
    while (jobs := slurm_cluster.run("squeue", "-h", "-o", "%i").stdout.split()) and time.monotonic() < deadline:
        time.sleep(1)
    out = slurm_cluster.run("sinfo", "-h", "-o", "%P %a %T").stdout.split("\n")
    rows = {line.split()[0]: line.split()[1:] for line in out if line.strip()}
    assert rows == {"debug*": ["up", "idle"], "cpu": ["up", "idle"]}, (out, jobs)
    assert slurm_cluster.partitions == ("debug", "cpu")
    assert slurm_cluster.slurm_conf == str(slurm_cluster.state_dir / "slurm.conf")


def test_sbatch_job_completes(slurm_cluster: SlurmCluster, tmp_path: Path):
    out = tmp_path / "out.txt"
    job = slurm_cluster.sbatch("-o", str(out), "--wrap", "echo hello from $SLURM_JOB_PARTITION")
    assert wait_for_state(job, "COMPLETED", timeout=30) == "COMPLETED"
    assert out.read_text().strip() == "hello from debug"  # the default partition
    assert sacct_fields(slurm_cluster, job, "Partition,ExitCode", "debug|0:0") == "debug|0:0"


def test_failing_job_is_failed(slurm_cluster: SlurmCluster):
    job = slurm_cluster.sbatch("-p", "cpu", "-o", "/dev/null", "--wrap", "exit 1")
    assert wait_for_state(job, "FAILED", timeout=30) == "FAILED"
    assert sacct_fields(slurm_cluster, job, "Partition,ExitCode", "cpu|1:0") == "cpu|1:0"


def test_scancel_of_running_job_is_cancelled(slurm_cluster: SlurmCluster):
    job = slurm_cluster.sbatch("-o", "/dev/null", "--wrap", "sleep 300")
    slurm_cluster.wait_for_running(job)
    slurm_cluster.run("scancel", job)
    assert wait_for_state(job, "CANCELLED", timeout=30) == "CANCELLED"


# --------------------------------------------------------------------------------------------
# submitit


def add(a: int, b: int) -> int:
    return a + b


def sleep_forever() -> None:
    time.sleep(600)


class Counter(Checkpointable):
    """Counts to ``n``, one step every 0.1 s (0.02 s once requeued, to keep the tests short),
    logging to ``path``. submitit's checkpoint (the inherited ``checkpoint``) pickles the object,
    ``done`` included, so a checkpointed run resumes where it stopped; a run restarted from the
    submitted pickle starts again at 0."""

    def __init__(self, path: str, n: int) -> None:
        self.path = path
        self.n = n
        self.done = 0

    def __call__(self) -> int:
        restarts = os.environ.get("SLURM_RESTART_COUNT", "0")
        with open(self.path, "a") as f:
            f.write(f"start {restarts} {self.done}\n")
        while self.done < self.n:
            with open(self.path, "a") as f:
                f.write(f"step {self.done}\n")
            time.sleep(0.1 if restarts == "0" else 0.02)
            self.done += 1
        return self.done


def _executor(folder: Path, **params) -> "submitit.AutoExecutor":
    executor = submitit.AutoExecutor(folder=folder, cluster="slurm")
    # timeout_min=60: under ~10 minutes submitit counts every USR2 as a time-out (fewer requeues).
    executor.update_parameters(**{"slurm_partition": "cpu", "timeout_min": 60, **params})
    return executor


# Slurm states of a job still in the queue (a requeued job is PENDING again, then RUNNING)
_QUEUED = ("PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "CONFIGURING", "COMPLETING", "SUSPENDED", "RESIZING")


def _queued(job) -> bool:
    return str(job.get_info(mode="force").get("State", "")).split(" ")[0] in _QUEUED


def _result(job, timeout: float):
    """job.result() once the job has left Slurm's queue, failing after ``timeout`` s instead of
    waiting for ever. A requeued job's interrupted run can leave an outcome before the requeued
    run writes its own: on a loaded machine the requeue's SIGTERM can reach the `scontrol
    requeue` that submitit's handler is still waiting on, and the handler records that as the
    job's error while the job is already queued again."""
    deadline = time.monotonic() + timeout
    while not job.done() or _queued(job):
        if time.monotonic() > deadline:
            job.cancel(check=False)
            raise AssertionError(
                f"submitit job {job.job_id} not done after {timeout} s (state {job.state})\n"
                f"stdout:\n{job.stdout()}\nstderr:\n{job.stderr()}"
            )
        time.sleep(0.3)
    return job.result()


def _wait_for_steps(path: Path, steps: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.read_text().count("step ") >= steps):
        assert time.monotonic() < deadline, f"no {steps} steps in {path} after {timeout} s"
        time.sleep(0.1)


def _starts(path: Path) -> list[tuple[int, int]]:
    """(SLURM_RESTART_COUNT, step it started from) for each run of a Counter."""
    return [tuple(map(int, line.split()[1:])) for line in path.read_text().splitlines() if line.startswith("start")]


@needs_submitit
def test_submitit_job_returns_result_and_completes(slurm_env: SlurmCluster, tmp_path: Path):
    job = _executor(tmp_path / "submitit").submit(add, 2, 3)
    assert _result(job, timeout=60) == 5
    deadline = time.monotonic() + 30
    while job.state != "COMPLETED":  # refreshed from sacct every 2 s or so
        assert time.monotonic() < deadline, f"submitit state {job.state}, expected COMPLETED"
        time.sleep(0.5)
    assert sacct_fields(slurm_env, job.job_id, "Partition", "cpu") == "cpu"


@needs_submitit
def test_submitit_cancel(slurm_env: SlurmCluster, tmp_path: Path):
    job = _executor(tmp_path / "submitit").submit(sleep_forever)
    slurm_env.wait_for_running(job.job_id)
    job.cancel()
    # submitit ignores SIGTERM; Slurm kills the job KillWait (5 s) later.
    assert wait_for_state(job.job_id, "CANCELLED", timeout=30) == "CANCELLED"
    deadline = time.monotonic() + 20
    while not job.done(force_check=True):  # unforced, submitit reads sacct less and less often
        assert time.monotonic() < deadline, f"submitit never saw the cancel (state {job.state})"
        time.sleep(0.3)
    assert job.state.startswith("CANCELLED")
    # result() raises instead of hanging; it first waits _results_timeout_s (15 s) for a result
    # file on a slow shared file system, which a local disk does not need.
    job._results_timeout_s = 1
    with pytest.raises(submitit.core.utils.UncompletedJobError):
        job.result()


@needs_submitit
def test_submitit_interrupt_checkpoints_and_requeues(slurm_env: SlurmCluster, tmp_path: Path):
    """job._interrupt() (scancel --signal USR2, as a preempted or timing-out job gets) runs
    submitit's handler: checkpoint(), `scontrol requeue`, and the next run resumes."""
    progress = tmp_path / "progress.txt"
    job = _executor(tmp_path / "submitit").submit(Counter(str(progress), 20))
    _wait_for_steps(progress, 3)
    job._interrupt(timeout=False)
    assert _result(job, timeout=90) == 20
    starts = _starts(progress)
    assert len(starts) == 2, progress.read_text()
    assert starts[0] == (0, 0)
    # 3 steps were logged before the signal: the checkpoint holds done >= 2
    assert starts[1][0] == 1 and starts[1][1] >= 2, f"did not resume from the checkpoint: {starts}"
    log = job.stdout()
    assert "this job is preempted" in log and "Calling checkpoint method" in log and "Requeued job" in log, log
    # submitit has the result before the job ends; then sacct -D lists every run of the job
    wait_for_state(job.job_id, "COMPLETED", timeout=30)
    runs = slurm_env.run("sacct", "-n", "-D", "-X", "-P", "-j", job.job_id, "-o", "State").stdout.split()
    assert runs == ["REQUEUED", "COMPLETED"]


@needs_submitit
def test_scontrol_requeue_restarts_from_submitted_pickle(slurm_env: SlurmCluster, tmp_path: Path):
    """`scontrol requeue` from outside sends SIGTERM (which submitit ignores), kills the job after
    KillWait and runs it again from the pickle submitted first: no checkpoint() call, so only
    state the job saved itself (its own checkpoint files) survives."""
    progress = tmp_path / "progress.txt"
    # 8 s of steps: more than the KillWait (5 s) that the job keeps running after the SIGTERM
    job = _executor(tmp_path / "submitit").submit(Counter(str(progress), 80))
    _wait_for_steps(progress, 3)
    slurm_env.run("scontrol", "requeue", job.job_id)
    assert _result(job, timeout=90) == 80
    starts = _starts(progress)
    assert starts == [(0, 0), (1, 0)], progress.read_text()
    assert "Calling checkpoint method" not in job.stdout()


@needs_submitit
def test_preemption_by_qos_checkpoints_and_requeues(slurm_env: SlurmCluster, tmp_path: Path):
    """A --qos=high job preempts a running job of QOS normal: Slurm sends the job's --signal
    (USR2), submitit checkpoints and requeues within the QOS GraceTime, and the job resumes."""
    progress = tmp_path / "progress.txt"
    cpus = int(slurm_env.run("sinfo", "-h", "-o", "%c").stdout.split()[0])
    job = _executor(tmp_path / "submitit", cpus_per_task=cpus).submit(Counter(str(progress), 20))
    _wait_for_steps(progress, 3)
    urgent = slurm_env.sbatch("--qos=high", "-c", str(cpus), "-o", "/dev/null", "--wrap", "sleep 1")
    assert _result(job, timeout=90) == 20
    assert wait_for_state(urgent, "COMPLETED", timeout=30) == "COMPLETED"
    starts = _starts(progress)
    assert len(starts) == 2 and starts[1][1] >= 2, progress.read_text()
    log = job.stdout()
    assert "this job is preempted" in log and "Calling checkpoint method" in log, log
