"""launcher=slurm against a real one-node Slurm cluster (tests/slurm_cluster.py): a 2-job
multirun, a failing job, a cancelled job in a sweep manifest, a requeued job resuming from its
checkpoint, plan mode for a sweep, and the clear errors (no Slurm, unknown partition, a layout
that does not fit nodes x ranks).

The cluster tests are skipped, with the reason, where the Slurm packages are not installed
(launchers/slurm/install_debian.sh) or the tests do not run as root; the error and plan tests
need no cluster.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

import pytest

from qwen3_trn.common.errors import ConfigError
from qwen3_trn.launch.slurm.job import TermWatch
from qwen3_trn.results.records import read_job_record, read_json, read_manifest, read_metrics, read_summary
from qwen3_trn.status import main as status_main
from tests.commands import command_in_process, command_in_subprocess, entry_point_in_process
from tests.conftest import REPO, compose_config
from tests.secret_values import SECRETS_IN_ENV, SECRETS_IN_LAUNCHER_ENV, files_with_secrets, process_cmdline, process_env, secret_args
from tests.slurm_cluster import SlurmCluster, slurm_cluster, slurm_env, wait_for_state  # noqa: F401

try:
    import submitit
except ImportError:
    submitit = None

pytestmark = pytest.mark.slow
needs_submitit = pytest.mark.skipif(submitit is None, reason="submitit is not installed (pip install -e '.[slurm]')")

# The smallest run (conf/debug/smoke.yaml): seconds of training on the cluster's CPU, no wandb.
TINY = ["debug=smoke"]
SLURM = ["launcher=slurm", "launcher.partition=cpu"]


def _execute(overrides: list[str], run_dir: Path) -> dict | None:
    from qwen3_trn.app import execute

    return execute(compose_config(overrides, run_dir))


def _status_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "qwen3_trn.status", *args], cwd=REPO, env={**os.environ, **env}, capture_output=True, text=True, timeout=300
    )


def _wait_until(predicate, timeout: float, what: str, poll: float = 0.5):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what} not after {timeout} s"
        time.sleep(poll)


def _job_log(run_dir: Path) -> str:
    job = read_summary(run_dir)["job"]
    return "".join(Path(p).read_text(errors="replace") for p in job["logs"] if Path(p).is_file())


# --------------------------------------------------------------------------------------------
# No cluster needed: clear errors and plan mode


def _fake_slurm_bin(tmp_path: Path, sinfo: str = "echo 'cpu*|1'") -> Path:
    """Stand-ins for Slurm's commands (a PATH on which Slurm 'is installed')."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True)
    for name in ("sbatch", "sinfo", "srun", "sacct", "squeue"):
        script = bin_dir / name
        script.write_text(f"#!/bin/sh\n{sinfo if name == 'sinfo' else 'exit 0'}\n")
        script.chmod(0o755)
    return bin_dir


def test_no_slurm_reachable_says_how_it_was_looked_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    empty = tmp_path / "nothing"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv("SLURM_CONF", raising=False)
    run_dir = tmp_path / "run"
    with pytest.raises(ConfigError) as err:
        _execute([*SLURM, *TINY], run_dir)
    message = str(err.value)
    assert err.value.key == "launcher" and "no Slurm is reachable" in message
    assert "sbatch, sinfo, srun, sacct, squeue not found" in message and f"PATH={empty}" in message
    assert "SLURM_CONF unset" in message
    assert not run_dir.exists(), "nothing may be written before the checks pass"

    # Slurm's commands are there, but SLURM_CONF points nowhere
    monkeypatch.setenv("PATH", str(_fake_slurm_bin(tmp_path)))
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "no" / "slurm.conf"))
    with pytest.raises(ConfigError, match=r"SLURM_CONF=.*/no/slurm.conf does not exist"):
        _execute([*SLURM, *TINY], run_dir)

    # ... or the controller does not answer
    monkeypatch.setenv(
        "PATH",
        str(_fake_slurm_bin(tmp_path / "down", "echo 'sinfo: error: Unable to contact slurm controller (connect failure)' >&2; exit 1")),
    )
    monkeypatch.delenv("SLURM_CONF")
    with pytest.raises(ConfigError, match=r"could not reach the Slurm controller \(sinfo: error: Unable to contact slurm controller"):
        _execute([*SLURM, *TINY], run_dir)
    assert not run_dir.exists()


def test_nodes_times_ranks_must_match_the_parallel_degrees(tmp_path: Path):
    with pytest.raises(ConfigError) as err:
        _execute([*SLURM, *TINY, "launcher.nnodes=2", "launcher.nproc_per_node=2", "parallelism.dp_shard=3"], tmp_path / "run")
    assert err.value.key == "parallelism"
    assert "world size is 4 = launcher.nnodes 2 x launcher.nproc_per_node 2" in str(err.value)
    with pytest.raises(ConfigError, match="launcher.time: '5 minutes' is not a Slurm time limit"):
        _execute([*SLURM, *TINY, "launcher.time='5 minutes'"], tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_whether_a_launcher_waits_for_its_jobs_is_its_own_answer(tmp_path: Path):
    """The search and the sweep ask the launcher (``waits_for_jobs``), not a key of its config."""
    from qwen3_trn.launch import launcher_of

    def waits(overrides: list[str]) -> bool:
        return launcher_of(compose_config(overrides, tmp_path / "run").launcher).waits_for_jobs

    assert waits([*SLURM, "launcher.wait=true"]) and not waits(SLURM)
    assert waits([]) and launcher_of(None).name == "local"  # a local run has ended when launch returns


def test_a_slurm_job_records_through_the_launcher_that_submitted_it(tmp_path: Path):
    import pickle

    from qwen3_trn.launch.local import LocalLauncher
    from qwen3_trn.launch.slurm import SlurmLauncher, SlurmTrainJob

    job = pickle.loads(pickle.dumps(SlurmTrainJob(str(tmp_path), SlurmLauncher)))  # as submitit hands it to each node
    assert job.launcher is SlurmLauncher
    slurm_run, local_run = tmp_path / "slurm_run", tmp_path / "local_run"
    for run_dir in (slurm_run, local_run):
        run_dir.mkdir()
    job.launcher.record_job(slurm_run, {"id": "7", "state": "RUNNING"}, status="running")
    LocalLauncher.record_job(local_run, {"id": "8", "state": "RUNNING"}, status="running")
    assert read_summary(slurm_run)["job"] == {"launcher": "slurm", "id": "7", "state": "RUNNING"}
    assert SlurmLauncher.refresh([local_run]) == []  # another launcher's job is not Slurm's to refresh


@needs_submitit
def test_a_job_that_pickled_no_error_is_described_by_its_error_log_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A pruned trial or a killed rank ends its job without submitit's result pickle: its error
    is the error log's last line, read at once. submitit's ``exception()`` would first poll 15 s
    for the pickle (it is made to fail here, so that a call to it shows)."""
    import submitit

    from qwen3_trn.launch.slurm.state import job_error

    def waits_for_a_pickle(self):
        raise AssertionError("submitit's exception() polls for a result pickle the job never wrote")

    monkeypatch.setattr(submitit.SlurmJob, "exception", waits_for_a_pickle)
    stderr = tmp_path / "12_0_log.err"
    stderr.write_text(
        "pruned by the search at step 2 (validation loss 7.3851, trial 2)\nsrun: error: n1: task 0: Exited with exit code 1\n\n"
    )
    job = {"id": "12", "folder": str(tmp_path), "stderr": str(stderr)}
    assert job_error(job) == "srun: error: n1: task 0: Exited with exit code 1"
    stderr.unlink()
    assert job_error(job) is None


@needs_submitit
def test_plan_of_a_sweep_shows_each_job_and_its_submission(tmp_path: Path):
    sweep = tmp_path / "sweep"
    result = command_in_process(
        [
            "-m",
            "mode=plan",
            *SLURM,
            *TINY,
            "launcher.nnodes=2",
            "launcher.nproc_per_node=2",
            "parallelism=fsdp",
            "launcher.time=2:00:00",
            "+launcher.env.QWEN3_TRN_MARK=planned",
            "training.seed=1,2",
            f"hydra.sweep.dir={sweep}",
        ]
    )
    assert result.returncode == 0, result.stderr[-3000:]
    manifest = read_manifest(sweep)
    assert manifest["counts"]["planned"] == 2 and manifest["counts"]["total"] == 2
    plans = (sweep / "plan.txt").read_text().split("=== job #")[1:]  # after the table, each job's plan
    for num, seed in ((0, 1), (1, 2)):
        job = manifest["jobs"][num]
        plan = plans[num]
        assert plan.startswith(f"{num} ")
        # its differences from the sweep's base config
        assert f"training.seed: 42 -> {seed}" in plan and job["plan"]["differences"] == [f"training.seed: 42 -> {seed}"]
        # its world size and where it would run
        assert "world 4 = 2 node(s) x 2 rank(s)" in plan and job["plan"]["world_size"] == 4
        assert job["plan"]["where"].startswith("Slurm partition cpu, 2 node(s) x 1 task, time 2:00:00 (120 min)")
        # the exact submission: submitit's sbatch script, and what each node runs
        script = job["plan"]["submission"]
        assert script in plan
        for line in (
            "#SBATCH --nodes=2",
            "#SBATCH --ntasks-per-node=1",
            "#SBATCH --partition=cpu",
            "#SBATCH --time=120",
            "#SBATCH --signal=USR2@120",
            "export QWEN3_TRN_MARK=planned",
            "export WANDB_RESUME=allow",
            f"-u -m submitit.core._submit {sweep / str(num) / 'slurm'}",
        ):
            assert line in script, line
        assert (
            "torchrun --nnodes=2 --nproc_per_node=2 --rdzv_backend=c10d --rdzv_endpoint=<first node of SLURM_JOB_NODELIST>:"
            "<20000 + job id % 10000> --rdzv_id=slurm-$SLURM_JOB_ID"
        ) in plan
        assert f"#{num} planned   training.seed={seed}: world 4 on Slurm partition cpu" in result.stdout
        assert not (sweep / str(num)).exists(), "plan mode submits nothing and writes no run per job"


# --------------------------------------------------------------------------------------------
# On the cluster


@needs_submitit
def test_unknown_partition_and_too_many_nodes(slurm_env: SlurmCluster, tmp_path: Path):
    run_dir = tmp_path / "run"
    with pytest.raises(ConfigError) as err:
        _execute(["launcher=slurm", "launcher.partition=gpu", *TINY], run_dir)
    assert err.value.key == "launcher.partition"
    assert "'gpu' is not a partition of this Slurm cluster" in str(err.value) and "`sinfo` lists: debug (default), cpu" in str(err.value)
    with pytest.raises(ConfigError, match="launcher.nnodes: 2 nodes were asked for, but partition cpu has 1"):
        _execute([*SLURM, *TINY, "launcher.nnodes=2"], run_dir)
    assert not run_dir.exists()


@needs_submitit
def test_two_job_multirun_on_slurm(slurm_cluster: SlurmCluster, tmp_path: Path):
    from qwen3_trn.launch.slurm import sbatch_script
    from qwen3_trn.results.records import load_run_config

    sweep = tmp_path / "sweep"
    # submitted from this process (the command's entry point); the jobs are Slurm's processes
    result = command_in_process(
        [
            "-m",
            *SLURM,
            "launcher.wait=true",
            *TINY,
            "training.steps=3",
            "+launcher.env.QWEN3_TRN_MARK=from-config",
            *secret_args(),
            "training.seed=1,2",
            f"hydra.sweep.dir={sweep}",
        ],
        env={**slurm_cluster.env, **SECRETS_IN_ENV},
    )
    assert result.returncode == 0, f"stdout:\n{result.stdout[-3000:]}\nstderr:\n{result.stderr[-3000:]}"
    manifest = read_manifest(sweep)
    assert manifest["counts"]["completed"] == 2 and manifest["complete"] is True, result.stdout[-3000:] + result.stderr[-3000:]
    job_ids = set()
    for num in (0, 1):
        run_dir = sweep / str(num)
        summary = read_summary(run_dir)
        slurm = summary["job"]
        assert summary["status"] == "completed" and slurm["state"] == "COMPLETED" and slurm["launcher"] == "slurm", summary
        assert [r["step"] for r in read_metrics(run_dir)] == [1, 2, 3]
        assert wait_for_state(slurm["id"], "COMPLETED", timeout=30) == "COMPLETED"
        job_ids.add(slurm["id"])
        # one Slurm job per sweep job, its logs and states in the manifest
        job = manifest["jobs"][num]
        assert job["status"] == "completed" and job["job"]["id"] == slurm["id"] and job["log"] == slurm["stdout"]
        assert read_job_record(run_dir)["status"] == "completed"
        assert "Job completed successfully" in _job_log(run_dir)
        # launcher.env reaches the job; the script is what plan mode renders
        submitted = Path(slurm["submission_file"]).read_text()
        assert "export QWEN3_TRN_MARK=from-config" in submitted and "#SBATCH --partition=cpu" in submitted
        assert submitted == sbatch_script(load_run_config(str(run_dir / "config.yaml")), 1, run_dir / "slurm")
    assert len(job_ids) == 2
    # no secret of the environment or of launcher.env in any file of the sweep
    assert files_with_secrets(sweep) == []
    assert "# HF_TOKEN: from the submitting environment" in submitted
    assert "2 jobs: 2 completed, 0 failed" in result.stdout and "[sweep] #0 submitted training.seed=1: Slurm job" in result.stdout


@needs_submitit
def test_failing_job_is_reported_failed(slurm_env: SlurmCluster, tmp_path: Path, capsys: pytest.CaptureFixture):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"line {i} " * 40}) + "\n" for i in range(20)))
    run_dir = tmp_path / "run"

    def remove_once_submitted():
        # the checks before submitting read the file; the job, which starts seconds later, finds it gone
        _wait_until(lambda: "id" in ((read_json(run_dir / "summary.json") or {}).get("job") or {}), 120, "the submission", poll=0.02)
        corpus.unlink()

    remover = threading.Thread(target=remove_once_submitted, daemon=True)
    remover.start()
    with pytest.raises(SystemExit) as ended:
        _execute([*SLURM, *TINY, "training.steps=3", "data=files", f"data.path={corpus}", "launcher.wait=true"], run_dir)
    remover.join(timeout=10)
    assert ended.value.code == 1 and getattr(ended.value, "run_status", None) == "failed"
    summary = read_summary(run_dir)
    job_id = summary["job"]["id"]
    assert summary["status"] == "failed" and summary["job"]["state"] == "FAILED"
    reason = f"ConfigError: data.path: '{corpus}' does not exist"
    assert summary["error"].startswith(f"Slurm job {job_id} FAILED: ") and reason in summary["error"], summary["error"]
    assert wait_for_state(job_id, "FAILED", timeout=30) == "FAILED"
    err = capsys.readouterr().err
    assert f"error: Slurm job {job_id} ended FAILED: " in err and reason in err and summary["job"]["stderr"] in err
    assert status_main([str(run_dir)]) == 1
    assert f"failed     job {job_id}" in capsys.readouterr().out


@needs_submitit
def test_scancel_shows_cancelled_in_the_sweep_manifest(slurm_cluster: SlurmCluster, tmp_path: Path):
    sweep = tmp_path / "sweep"
    cpus = slurm_cluster.run("sinfo", "-h", "-o", "%c").stdout.split()[0]
    # each job takes every CPU of the node: job #1 waits in the queue while #0 runs
    result = command_in_process(
        ["-m", *SLURM, *TINY, "training.steps=100000", f"launcher.cpus_per_task={cpus}", "training.seed=1,2", f"hydra.sweep.dir={sweep}"],
        env=slurm_cluster.env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert re.search(r"2 jobs: 0 completed, 0 failed, 0 skipped(, \d (submitted|pending|running))+ ", result.stdout), result.stdout[-2000:]
    assert "python -m qwen3_trn.status" in result.stdout
    first, second = (read_summary(sweep / str(n))["job"]["id"] for n in (0, 1))
    slurm_cluster.wait_for_running(first, timeout=60)
    slurm_cluster.run("scancel", first)
    assert wait_for_state(first, "CANCELLED", timeout=30) == "CANCELLED"

    status = _status_cli(str(sweep), env=slurm_cluster.env)
    assert status.returncode == 1, status.stdout + status.stderr  # a cancelled job
    manifest = read_manifest(sweep)
    jobs = manifest["jobs"]
    assert jobs[0]["status"] == "cancelled" and jobs[0]["job"]["state"] == "CANCELLED"
    assert jobs[1]["status"] in ("pending", "running"), jobs[1]
    assert manifest["complete"] is False and manifest["counts"]["cancelled"] == 1
    assert f"#0 cancelled  job {first}" in status.stdout
    assert read_job_record(sweep / "0")["status"] == "cancelled"

    slurm_cluster.run("scancel", second)
    wait_for_state(second, "CANCELLED", timeout=30)
    # then through its main in this process: the same command, as a process above
    status = entry_point_in_process(status_main, ["qwen3_trn.status", str(sweep), "--json"], slurm_cluster.env)
    assert [row["status"] for row in json.loads(status.stdout)] == ["cancelled", "cancelled"]
    assert read_manifest(sweep)["complete"] is True


@needs_submitit
def test_requeued_job_resumes_from_its_checkpoint(slurm_env: SlurmCluster, tmp_path: Path):
    run_dir = tmp_path / "run"
    # Enough steps that the first run is still training when the interrupt lands after its first
    # checkpoint (8 steps could all be done and checkpointed by then on an idle machine, and the
    # requeued run would resume at the end with nothing left to log).
    total_steps = 40
    # logger=wandb (offline): the resumed job continues the same wandb run
    overrides = [
        *SLURM,
        *TINY,
        "logger=wandb",
        f"training.steps={total_steps}",
        "checkpoint=on",
        "checkpoint.interval=2",
    ]
    summary = _execute(overrides, run_dir)
    assert summary["status"] == "submitted"
    job_id = summary["job"]["id"]
    # any complete checkpoint: keep_latest_k removes step-2 once later ones are written
    _wait_until(lambda: any((run_dir / "checkpoint").glob("step-*/.metadata")), 180, "the first checkpoint")
    before = [r["step"] for r in read_metrics(run_dir)]
    # what a preemption or a time limit does (scancel --signal TERM, then USR2): submitit calls
    # SlurmTrainJob.checkpoint and requeues the job
    submitit.SlurmJob(folder=run_dir / "slurm", job_id=job_id)._interrupt(timeout=False)

    from qwen3_trn.launch.slurm import SlurmLauncher

    final = _wait_until(
        lambda: next((s for s in SlurmLauncher.refresh([run_dir]) if s["status"] in ("completed", "failed", "cancelled")), None),
        240,
        "the requeued job's end",
        poll=2,
    )
    assert final["status"] == "completed", _job_log(run_dir)[-3000:]
    runs = slurm_env.run("sacct", "-n", "-D", "-X", "-P", "-j", job_id, "-o", "State").stdout.split()
    assert runs == ["REQUEUED", "COMPLETED"], runs
    log = _job_log(run_dir)
    assert "Calling checkpoint method" in log and f"Requeued job {job_id}" in log, log[-3000:]

    summary = read_summary(run_dir)
    records = read_metrics(run_dir)
    steps = [r["step"] for r in records]
    # the lines written before and after the requeued job started again (it may resume exactly
    # at the last step the first run logged, so the steps alone need not show the restart)
    first_run = [r["step"] for r in records if r["time"] < summary["job"]["started"]]
    second_run = [r["step"] for r in records if r["time"] >= summary["job"]["started"]]
    assert first_run + second_run == steps, steps
    resumed_from = second_run[0] - 1
    # the first run's lines after the checkpoint it resumed from are dropped: each step once
    assert first_run == list(range(1, resumed_from + 1)) and len(before) >= 2, steps
    # the second run continues after a checkpoint step (checkpoint.interval=2)
    assert resumed_from % 2 == 0 and resumed_from >= 2, steps
    assert second_run == list(range(resumed_from + 1, total_steps + 1)), steps
    assert summary["job"]["restarts"] == 1 and summary["job"]["requeues"] == 1, summary
    assert summary["first_step"] == 1 and summary["last_step"] == total_steps and summary["steps_logged"] == total_steps, summary

    # the same wandb run, resumed: both starts used the id planned in tracking.json
    tracking = json.loads((run_dir / "tracking.json").read_text())
    run_id = tracking["wandb"]["id"]
    assert summary["wandb_run_id"] == run_id
    offline = sorted(p.name for p in (run_dir / "wandb").glob("offline-run-*"))
    assert len(offline) == 2 and all(name.endswith(f"-{run_id}") for name in offline), offline
    assert "export WANDB_RESUME=allow" in Path(summary["job"]["submission_file"]).read_text()


@needs_submitit
def test_secrets_reach_the_job_through_its_environment_not_a_file(slurm_cluster: SlurmCluster, tmp_path: Path):
    """WANDB_API_KEY, HF_TOKEN and AWS_SECRET_ACCESS_KEY in the environment and in launcher.env:
    the job's processes have them (launcher.env's, through sbatch's environment), no file of the
    run directory (config, sbatch script, Slurm logs, wandb run) holds them."""
    run_dir = tmp_path / "run"
    result = command_in_subprocess(
        [*SLURM, *TINY, "logger=wandb", "training.steps=3", *secret_args()],
        run_dir,
        timeout=300,
        env={**slurm_cluster.env, **SECRETS_IN_ENV},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    folder = str(run_dir / "slurm")

    def job_processes():
        pids = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]
        return [pid for pid in pids if "submitit.core._submit" in process_cmdline(pid) and folder in process_cmdline(pid)]

    pids = _wait_until(job_processes, 180, "the job's process")
    env = process_env(pids[0])
    assert {key: env.get(key) for key in SECRETS_IN_LAUNCHER_ENV} == SECRETS_IN_LAUNCHER_ENV
    assert env.get("QWEN3_TRN_SERVICE_TOKEN") == SECRETS_IN_ENV["QWEN3_TRN_SERVICE_TOKEN"]

    from qwen3_trn.launch.slurm import SlurmLauncher

    final = _wait_until(
        lambda: next((s for s in SlurmLauncher.refresh([run_dir]) if s["status"] in ("completed", "failed", "cancelled")), None),
        300,
        "the job's end",
        poll=2,
    )
    assert final["status"] == "completed", _job_log(run_dir)[-3000:]
    assert list((run_dir / "wandb").glob("offline-run-*")) and list((run_dir / "slurm").glob("*_submission.sh"))
    assert files_with_secrets(run_dir) == []


def test_a_sigterm_taken_by_the_elastic_agents_handler_still_reads_as_slurm_stopping_the_job():
    """Slurm's SIGTERM reaches the job's process and its ranks together; torch elastic's agent,
    whose handler holds SIGTERM while it runs, may raise its ranks' failure before its own
    SignalException. The job must still wait for the requeue, not record a failure."""
    before = signal.getsignal(signal.SIGTERM)
    watch = TermWatch()
    try:
        assert not watch.stopped_by_slurm(RuntimeError("rank 0 failed"))
        signal.signal(signal.SIGTERM, lambda signum, frame: None)  # the agent's handler, which swallows it here
        os.kill(os.getpid(), signal.SIGTERM)
        assert watch.stopped_by_slurm(RuntimeError("rank 0 failed: Signal 15 (SIGTERM)"))
    finally:
        watch.restore()
        signal.signal(signal.SIGTERM, before)


@pytest.fixture
def job_watch() -> Iterator[Callable[..., TermWatch]]:
    """``job_watch(runs_requeue)``: a Slurm job's ``TermWatch`` over the USR2 handler the test set;
    this process's SIGTERM and USR2 handlers are put back after the test."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGUSR2)}
    watches = []

    def watch(runs_requeue: bool) -> TermWatch:
        watches.append(TermWatch(signal.SIGUSR2, runs_requeue=runs_requeue))
        return watches[-1]

    yield watch
    for made in watches:
        made.restore()
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def _lead_tasks_requeue(exits: list[int]) -> Callable[..., None]:
    """submitit's USR2 handler on the lead task, its steps: ``scontrol requeue`` (a child stands in
    for it), which Slurm's SIGTERM to every process of the step reaches too, then exit."""

    def handler(signum, frame) -> None:
        scontrol = subprocess.Popen(["sleep", "0.3"])
        for pid in (os.getpid(), scontrol.pid):
            os.kill(pid, signal.SIGTERM)
        exits.append(scontrol.wait())
        sys.exit(-1)

    return handler


def _other_tasks_return(done: list[str]) -> Callable[..., None]:
    """submitit's USR2 handler on another task: it returns, with Slurm's SIGTERM taken meanwhile."""

    def handler(signum, frame) -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
        done.append("returned")

    return handler


@pytest.mark.parametrize("lead", [True, False], ids=["lead-task-requeues", "other-task-returns"])
def test_a_sigterm_that_comes_while_submitit_requeues_does_not_stop_the_requeue(job_watch, lead):
    """A preemption sends SIGTERM and USR2, in either order. On the lead task submitit's USR2
    handler runs ``scontrol requeue`` and exits; on the others it returns. Two faults were seen
    here, each a requeued job that read as failed: the SIGTERM taken inside the handler, where
    torch elastic's agent handler raises (``_terminate_process_handler``,
    torch/distributed/elastic/multiprocessing/api.py) and the requeue was abandoned; and Slurm's
    SIGTERM to every process of the step killing the ``scontrol`` process itself."""
    from torch.distributed.elastic.multiprocessing.api import SignalException, _terminate_process_handler

    done: list = []
    signal.signal(signal.SIGUSR2, _lead_tasks_requeue(done) if lead else _other_tasks_return(done))
    watch = job_watch(runs_requeue=lead)
    signal.signal(signal.SIGTERM, _terminate_process_handler)  # the elastic agent runs the ranks
    with pytest.raises(SystemExit if lead else SignalException):
        os.kill(os.getpid(), signal.SIGUSR2)
        time.sleep(1)
    assert done == ([0] if lead else ["returned"]), "the requeue was stopped"
    if not lead:
        assert watch.stopped_by_slurm(RuntimeError("rank 0 failed: Signal 15 (SIGTERM)"))
    assert signal.getsignal(signal.SIGTERM) is _terminate_process_handler


def test_while_the_job_waits_for_its_requeue_a_sigterm_neither_raises_nor_stops_the_requeue(job_watch):
    """The ranks died of Slurm's SIGTERM and the job waits for submitit's requeue. torch elastic's
    agent has left its raising handler in place; a second SIGTERM (the requeue's own) must not end
    the wait, and the requeue that comes then is guarded as before."""
    from torch.distributed.elastic.multiprocessing.api import _terminate_process_handler

    exits: list[int] = []
    signal.signal(signal.SIGUSR2, _lead_tasks_requeue(exits))
    watch = job_watch(runs_requeue=True)
    signal.signal(signal.SIGTERM, _terminate_process_handler)  # what the agent leaves behind
    watch.watch_again()
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.1)
    assert watch.received
    with pytest.raises(SystemExit):
        os.kill(os.getpid(), signal.SIGUSR2)
        time.sleep(1)
    assert exits == [0]
