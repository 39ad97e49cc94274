"""Nothing lost, nothing leaked, with real processes: runs started at once, Ctrl-C on a
multi-rank run, a save killed half-way, a disk that fills up during a save, and secrets in the
environment and in launcher.env."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from torch.distributed.checkpoint.api import CheckpointException

from qwen3_trn.checkpointing import CheckpointSaveError, GuardedCheckpointManager
from qwen3_trn.results.records import read_metrics, read_summary
from qwen3_trn.titan import CheckpointManager
from tests.commands import command_in_process, rank_processes, start_command
from tests.secret_values import SECRETS_IN_ENV, SECRETS_IN_LAUNCHER_ENV, files_with_secrets, process_env, secret_args

pytestmark = pytest.mark.slow


def wait_for(predicate, timeout: float, what: str, proc: subprocess.Popen | None = None, poll: float = 0.2):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"the run ended (exit {proc.returncode}) before {what}\n{out[-2000:]}\n{err[-3000:]}")
        assert time.monotonic() < deadline, f"{what} not after {timeout} s"
        time.sleep(poll)


def session_processes(sid: int) -> list[int]:
    """Live (not zombie) processes of a session."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[3]) == sid:
            found.append(int(stat.parent.name))
    return found


def steps_logged(run_dir: Path) -> int:
    return len(read_metrics(run_dir))


def test_four_runs_started_at_once_get_four_directories(tmp_path):
    """Four runs with one timestamped directory pattern (one ${now:%Y} for all: they collide),
    two per core: each claims its own directory, none fails, none writes into another's."""
    pattern = f"{tmp_path}/runs/" + "${now:%Y}"
    runs = [
        start_command(["debug=smoke", "training.steps=2", f"training.seed={n}", f"hydra.run.dir={pattern}"], env={"OMP_NUM_THREADS": "1"})
        for n in range(4)
    ]
    results = [run.communicate(timeout=1200) for run in runs]
    for run, (out, err) in zip(runs, results):
        assert run.returncode == 0, f"{out[-2000:]}\n{err[-3000:]}"
    dirs = sorted((tmp_path / "runs").iterdir())
    assert len(dirs) == 4, dirs
    seeds = set()
    for run_dir in dirs:
        summary = read_summary(run_dir)
        assert summary["status"] == "completed" and summary["run_dir"] == str(run_dir), summary
        assert [r["step"] for r in read_metrics(run_dir)] == [1, 2]
        seeds.add(summary["seed"])
    assert seeds == set(range(4)), "every run wrote to a directory of its own"
    assert sum("was taken by a run started at the same time" in out for out, _ in results) == 3


def test_ctrl_c_stops_every_rank_and_marks_the_run_interrupted(tmp_path):
    run_dir = tmp_path / "run"
    run = start_command(
        ["debug=smoke", "logger=wandb", "launcher.nproc_per_node=2", "parallelism=fsdp", "training.steps=100000"],
        run_dir,
    )
    wait_for(lambda: steps_logged(run_dir) >= 2, 300, "two steps", run)
    ranks = [pid for pid in session_processes(run.pid) if pid != run.pid]
    assert len(ranks) >= 2, ranks
    os.killpg(run.pid, signal.SIGINT)  # what Ctrl-C in the terminal does
    sent = time.monotonic()
    out, err = run.communicate(timeout=120)
    stopped_s = time.monotonic() - sent
    assert run.returncode == 130, err[-3000:]
    assert stopped_s < 30, f"took {stopped_s:.1f} s to stop"
    print(f"Ctrl-C on a 2-rank run: exit 130 after {stopped_s:.1f} s")
    assert "Traceback" not in err.split("interrupted")[-1]
    wait_for(lambda: not session_processes(run.pid), 10, "every process of the run to be gone")
    summary = read_summary(run_dir)
    assert summary["status"] == "interrupted" and summary["steps_logged"] >= 2, summary


def _freeze_during_save(run: subprocess.Popen, folder: Path, after_step: int, timeout: float = 300) -> Path:
    """Stop the run's whole session while it writes a checkpoint newer than ``after_step``
    (its step-N folder exists, its .metadata not yet); returns that folder."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert run.poll() is None, "the run ended before a save could be caught in flight"
        for step_dir in folder.glob("step-*"):
            if int(step_dir.name.split("-")[1]) > after_step and not (step_dir / ".metadata").exists():
                os.killpg(run.pid, signal.SIGSTOP)
                if (step_dir / ".metadata").exists():  # it finished in between: let it go on
                    os.killpg(run.pid, signal.SIGCONT)
                    continue
                return step_dir
        time.sleep(0.001)
    raise AssertionError("no save caught in flight")


def test_kill_during_a_save_resumes_from_the_previous_complete_checkpoint(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    common = ["debug=smoke", "checkpoint=on", "checkpoint.interval=2", "checkpoint.keep_latest_k=0"]
    run = start_command([*common, "training.steps=200"], first)
    wait_for(lambda: (first / "checkpoint" / "step-2" / ".metadata").is_file(), 300, "the first checkpoint", run)
    torn = _freeze_during_save(run, first / "checkpoint", after_step=2)
    os.killpg(run.pid, signal.SIGKILL)
    run.communicate(timeout=60)
    torn_step = int(torn.name.split("-")[1])
    assert torn.is_dir() and not (torn / ".metadata").exists()
    previous = first / "checkpoint" / f"step-{torn_step - 2}"
    assert (previous / ".metadata").is_file()

    result = command_in_process([*common, f"training.steps={torn_step}", f"checkpoint.resume_from={first}"], second)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"resuming from {previous}" in result.stdout
    assert f"skipped {torn}: no .metadata: its save did not finish" in result.stdout
    assert [r["step"] for r in read_metrics(second)] == [torn_step - 1, torn_step]
    summary = read_summary(second)
    assert summary["resumed_from"] == str(previous) and summary["skipped_checkpoints"][0].startswith(str(torn))


@pytest.fixture
def small_disk(tmp_path):
    """A 40 MiB tmpfs: room for one checkpoint of model=tiny (27 MiB), not two."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root; the disk-full test runs as root in CI")
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=40m", "tmpfs", str(mount)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_disk_full_during_a_save_says_so_and_keeps_the_previous_checkpoint(tmp_path, small_disk):
    run_dir, resumed = tmp_path / "run", tmp_path / "resumed"
    folder = small_disk / "ckpt"
    common = ["debug=smoke", "checkpoint=on", "checkpoint.interval=2", "checkpoint.keep_latest_k=0", f"checkpoint.folder={folder}"]
    result = command_in_process([*common, "training.steps=6"], run_dir)
    assert result.returncode == 1, result.stderr[-3000:]
    message = f"checkpoint save at step 4 failed: no space left on device writing to {folder}"
    assert message in result.stderr and f"the previous checkpoint {folder / 'step-2'} is complete and loadable" in result.stderr
    summary = read_summary(run_dir)
    assert summary["status"] == "failed" and message in summary["error"], summary
    assert (folder / "step-2" / ".metadata").is_file() and not (folder / "step-4").exists()
    # the previous checkpoint really loads: a run resumed from it continues at step 3
    result = command_in_process(["debug=smoke", "training.steps=3", f"checkpoint.resume_from={folder / 'step-2'}"], resumed)
    assert result.returncode == 0, result.stderr[-3000:]
    assert [r["step"] for r in read_metrics(resumed)] == [3]


def test_no_secret_is_written_but_the_ranks_see_them(tmp_path):
    run_dir = tmp_path / "run"
    run = start_command(
        [
            "debug=smoke",
            "logger=wandb",
            "launcher.nproc_per_node=2",
            "parallelism=fsdp",
            "training.steps=12",
            *secret_args(),
        ],
        run_dir,
        env=SECRETS_IN_ENV,
    )
    wait_for(lambda: steps_logged(run_dir) >= 1, 300, "the first step", run)
    ranks = [process_env(pid) for pid in rank_processes(session_processes(run.pid))]
    out, err = run.communicate(timeout=600)
    assert run.returncode == 0, err[-3000:]
    # the ranks got launcher.env's values (they win over the environment's) and the rest of the environment
    assert len(ranks) == 2, ranks
    for env in ranks:
        assert {key: env.get(key) for key in SECRETS_IN_LAUNCHER_ENV} == SECRETS_IN_LAUNCHER_ENV
        assert env.get("QWEN3_TRN_SERVICE_TOKEN") == SECRETS_IN_ENV["QWEN3_TRN_SERVICE_TOKEN"]
    assert list((run_dir / "wandb").glob("offline-run-*")), "the wandb run was written"
    assert files_with_secrets(run_dir) == []
    assert "HF_TOKEN: <redacted>" in (run_dir / "config.yaml").read_text()
    assert "+launcher.env.HF_TOKEN=<redacted>" in (run_dir / "overrides.yaml").read_text()
    assert not any(v in out + err for v in (*SECRETS_IN_ENV.values(), *SECRETS_IN_LAUNCHER_ENV.values()))

    # a sweep (planned): sweep.json, multirun.yaml, manifest and the plans of its jobs
    sweep = tmp_path / "sweep"
    result = command_in_process(["-m", "mode=plan", "training.seed=1,2", *secret_args(), f"hydra.sweep.dir={sweep}"], env=SECRETS_IN_ENV)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (sweep / "multirun.yaml").is_file() and (sweep / "plan.txt").read_text().count("=== job #") == 2
    assert files_with_secrets(sweep) == []
    assert 'HF_TOKEN="$HF_TOKEN"' in (sweep / "plan.txt").read_text()


@pytest.mark.parametrize("cause", [KeyboardInterrupt(), OSError(28, "No space left on device")], ids=["ctrl-c", "disk-full"])
def test_a_save_that_dcp_reports_failed_is_an_interrupt_only_when_ctrl_c_caused_it(tmp_path, monkeypatch, cause):
    """torch's distributed checkpoint wraps whatever stopped a rank's save, a Ctrl-C included, in
    its CheckpointException: an interrupted save ends the run as interrupted (KeyboardInterrupt),
    any other as a failed save; the incomplete step folder goes either way."""

    def failing_save(self, curr_step, last_step=False):
        (tmp_path / f"step-{curr_step}").mkdir()
        raise CheckpointException("save failed", {0: (cause, None)})

    monkeypatch.setattr(CheckpointManager, "_save", failing_save)
    manager = object.__new__(GuardedCheckpointManager)
    manager.folder = str(tmp_path)
    expected = KeyboardInterrupt if isinstance(cause, KeyboardInterrupt) else CheckpointSaveError
    with pytest.raises(expected):
        manager._save(24)
    assert not (tmp_path / "step-24").exists()
