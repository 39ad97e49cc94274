"""No run is left "running" after its processes are gone: a sweep of 2-rank runs whose
launching process is SIGKILLed (nothing it can catch, as the OOM killer does) reads as died,
with its last step, in ``python -m qwen3_trn.status`` (its job's run directory and the sweep),
in the sweep's manifest and report, and in a rerun of the sweep, which runs it again. One
killed sweep, shared by the module's tests."""

from __future__ import annotations

import csv
import json
import os
import signal
import socket
import subprocess
from pathlib import Path

import pytest

from qwen3_trn import status
from qwen3_trn.launch.slurm.state import status_of
from qwen3_trn.results.processes import is_gone, this_process, where
from qwen3_trn.results.records import read_manifest, read_metrics, read_summary
from tests.commands import command_in_process, entry_point_in_process, start_command
from tests.test_reliability import session_processes, steps_logged, wait_for

STEPS = 40
ARGS = [
    "-m",
    "training.seed=1,2",
    "launcher.nproc_per_node=2",
    "parallelism=fsdp",
    f"training.steps={STEPS}",
    "training.seq_len=64",
    "logger=none",
    "validation=off",
    "checkpoint.enable=false",
]


def _status(*args: str) -> subprocess.CompletedProcess:
    """``python -m qwen3_trn.status ARGS`` through its ``main`` in this process (as a real
    process: tests/test_launcher_slurm.py)."""
    return entry_point_in_process(status.main, ["qwen3_trn.status", *args])


@pytest.fixture(scope="module")
def killed_sweep(tmp_path_factory) -> Path:
    """A sweep SIGKILLed while its first job trains: (sweep dir, steps logged when killed)."""
    sweep_dir = tmp_path_factory.mktemp("died") / "sweep"
    sweep = start_command([*ARGS, f"hydra.sweep.dir={sweep_dir}"])
    wait_for(lambda: steps_logged(sweep_dir / "0") >= 2, 300, "two steps", sweep)
    assert len(session_processes(sweep.pid)) >= 3  # the launcher and its 2 ranks
    os.kill(sweep.pid, signal.SIGKILL)
    sweep.communicate(timeout=60)
    wait_for(lambda: not session_processes(sweep.pid), 30, "every rank to die with the launcher")
    return sweep_dir


@pytest.mark.slow
def test_a_killed_run_reads_as_died_with_its_last_step(killed_sweep):
    run_dir = killed_sweep / "0"
    assert read_summary(run_dir)["status"] == "running"  # as the kill left it
    last = read_metrics(run_dir)[-1]["step"]

    shown = _status("--json", str(run_dir))
    assert shown.returncode == 1, shown.stderr
    [row] = json.loads(shown.stdout)
    assert (row["status"], row["last_step"], row["run_dir"]) == ("died", last, str(run_dir))
    summary = read_summary(run_dir)
    assert summary["status"] == "died" and summary["last_step"] == last and "ended without recording an end" in summary["error"]

    text = _status(str(run_dir))
    assert text.returncode == 1 and text.stdout.split()[0] == "died" and f"last step {last}" in text.stdout, text.stdout


@pytest.mark.slow
def test_a_killed_sweep_job_reads_as_died_in_status_report_and_resume(killed_sweep):
    shown = _status("--json", str(killed_sweep))
    assert shown.returncode == 1, shown.stderr
    assert [(row["num"], row["status"]) for row in json.loads(shown.stdout)] == [(0, "died")]
    manifest = read_manifest(killed_sweep)
    assert manifest["counts"]["died"] == 1 and manifest["complete"], manifest["counts"]
    with open(killed_sweep / "report.csv") as f:
        assert [row["status"] for row in csv.DictReader(f)] == ["died"]

    rerun = command_in_process([*ARGS, f"hydra.sweep.dir={killed_sweep}"])
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "#0 died earlier: runs again" in rerun.stdout, rerun.stdout[-3000:]
    manifest = read_manifest(killed_sweep)
    assert [job["status"] for job in manifest["jobs"]] == ["completed", "completed"]
    assert read_summary(killed_sweep / "previous-attempts" / "0-1")["status"] == "died"


def test_a_process_is_gone_only_when_verifiably_so():
    """A live process, a pid that no process has, a pid reused by another process (another
    start time) and a process of another host (never taken for gone, shown as unchecked)."""
    me = this_process()
    assert not is_gone(me)
    ended = subprocess.Popen(["true"])
    ended.wait()
    assert is_gone({**me, "pid": ended.pid})
    assert is_gone({**me, "started": me["started"] - 1})  # this pid, but not the process recorded
    elsewhere = {**me, "host": f"not-{socket.gethostname()}", "pid": ended.pid}
    assert not is_gone(elsewhere)
    assert where(elsewhere) == f"on host not-{socket.gethostname()} (cannot check from here)"


def test_a_run_of_another_host_stays_running_unchecked(tmp_path):
    process = {**this_process(), "host": f"not-{socket.gethostname()}", "pid": 1}
    (tmp_path / "summary.json").write_text(json.dumps({"status": "running", "run_dir": str(tmp_path), "process": process}))
    shown = _status("--json", str(tmp_path))
    assert shown.returncode == 0, shown.stderr
    [row] = json.loads(shown.stdout)
    assert (row["status"], row["state"]) == ("running", f"on host {process['host']} (cannot check from here)")
    assert read_summary(tmp_path)["status"] == "running"


@pytest.mark.parametrize(
    "state, status",
    [("NODE_FAIL", "died"), ("OUT_OF_MEMORY", "died"), ("FAILED", "failed"), ("CANCELLED by 1000", "cancelled"), ("RUNNING", "running")],
)
def test_slurm_states_of_a_job_killed_hard_read_as_died(state, status):
    """A lost node and the OOM killer end a job without a chance to record its end: died; a
    job whose ranks exited with an error: failed (sacct's words, as ``job_state`` reads them)."""
    assert status_of(state) == status
