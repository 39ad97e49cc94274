"""No rank outlives its launcher: SIGKILL of the launching process (nothing it can catch) ends
every rank of a multi-rank run, and the run's records say it did not complete.

Two things make ranks die with their launcher: torch's multiprocessing asks the kernel for a
SIGINT to each rank when its parent dies (the launcher, or on CPU the fork server it started
the ranks from, which ends with it), which a rank can catch or miss (one stuck in a collective,
one whose SIGINT is ignored), and ``worker.die_with_launcher`` asks for a SIGKILL, which no
rank can. The first test runs the real command as ``nohup ... &`` would; the second shows the
project's own signal alone, on a process that ignores SIGINT.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from qwen3_trn.results.records import read_summary
from tests.commands import REPO, cli_env, start_command
from tests.test_reliability import session_processes, steps_logged, wait_for


@pytest.mark.slow
def test_sigkill_of_the_launcher_ends_every_rank(tmp_path):
    run_dir = tmp_path / "run"
    args = [
        "launcher.nproc_per_node=2",
        "parallelism=fsdp",
        "training.steps=100000",
        "training.seq_len=64",
        "logger=none",
        "validation=off",
    ]
    run = start_command(
        args,
        run_dir,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),  # as nohup ... & runs it
    )
    wait_for(lambda: steps_logged(run_dir) >= 2, 300, "two steps", run)
    ranks = [pid for pid in session_processes(run.pid) if pid != run.pid]
    assert len(ranks) >= 2, ranks
    os.kill(run.pid, signal.SIGKILL)  # the launcher only: its ranks get no signal from us
    run.wait(timeout=60)
    wait_for(lambda: not session_processes(run.pid), 30, "every rank to die with the launcher")
    logged = steps_logged(run_dir)
    summary = read_summary(run_dir)
    assert summary["status"] != "completed" and logged < 100000, summary
    assert steps_logged(run_dir) == logged, "nothing trains on after the launcher is gone"


CHILD = """
import os, signal, time
os.environ["TORCHELASTIC_RUN_ID"] = "test"  # as torch elastic's agent sets it for its ranks
signal.signal(signal.SIGINT, signal.SIG_IGN)  # a rank deaf to torch's own parent-death SIGINT
from qwen3_trn.run.worker import die_with_launcher
die_with_launcher()
print("armed", flush=True)
time.sleep(600)
"""
PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", sys.argv[1]], stdout=sys.stdout)
print(child.pid, flush=True)
time.sleep(600)
"""


def test_a_rank_dies_with_its_agent_even_when_it_ignores_sigint():
    """The mechanism alone: a process armed by ``die_with_launcher`` is killed by the kernel
    when its parent dies, whatever signals it ignores."""
    parent = subprocess.Popen([sys.executable, "-c", PARENT, CHILD], cwd=REPO, env=cli_env(), stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    assert parent.stdout.readline().strip() == "armed"
    parent.kill()
    parent.wait(timeout=30)
    wait_for(lambda: not os.path.exists(f"/proc/{child}") or open(f"/proc/{child}/stat").read().split()[2] == "Z", 30, "the child to die")
