"""Real training on the CPU through the command line users run. The default run and the
``debug=smoke`` run are the ones tests/test_docs.py runs for README.md's commands (the session's
``shared_run``, in this process); the run with every default as a real process is
tests/test_smallest_runs.py's."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from qwen3_trn.results.records import read_manifest, read_metrics, read_summary
from tests.commands import command_in_process, command_in_subprocess, start_command
from tests.conftest import FAST, assert_trained, compose_config

pytestmark = pytest.mark.slow


def _falls(records, by=0.2):
    return records[-1]["loss"] < records[0]["loss"] - by


def test_default_run_trains_offline_and_reports(shared_run):
    """``python -m qwen3_trn``."""
    run = shared_run([])
    result, run_dir = run.result, run.run_dir
    records = assert_trained(result, run_dir, steps=40)
    assert _falls(records, by=0.5), [r["loss"] for r in records]
    # live progress view and final summary on the console
    assert "tok/s" in result.stdout and "ETA" in result.stdout
    assert "loss first -> last" in result.stdout and str(run_dir) in result.stdout
    summary = read_summary(run_dir)
    assert summary["status"] == "completed"
    assert (summary["backend"], summary["device"], summary["world_size"]) == ("native", "cpu", 1)
    assert summary["first_loss"] == records[0]["loss"] and summary["last_loss"] == records[-1]["loss"]
    assert summary["tokens_per_s"] > 0 and 0 < summary["peak_memory_gib"] < 4
    for name in ("config.yaml", "overrides.yaml", "trainer_config.json", "logs/rank0.log"):
        assert (run_dir / name).is_file(), name
    assert json.loads((run_dir / "trainer_config.json").read_text())["model_spec"]["flavor"] == "debugmodel"
    for record in records:
        assert {"loss", "grad_norm", "tokens_per_s", "memory_peak_gib", "lr_AdamW"} <= record.keys()
    # held-out loss after step 1, every 10 steps and at the end, on the console and in the summary
    validated = {r["step"]: r["val_loss"] for r in records if "val_loss" in r}
    assert sorted(validated) == [1, 10, 20, 30, 40]
    assert validated[40] < validated[1] - 0.5, validated
    assert summary["val_loss"] == validated[40] and summary["val_step"] == 40
    assert f"step    40/40  val_loss {validated[40]:8.4f}" in result.stdout
    assert "val loss (perplexity)" in result.stdout


def test_debug_smoke_is_the_smallest_run_of_any_kind(shared_run, tmp_path):
    """``python -m qwen3_trn debug=smoke``: 3 steps of 2 x 64 tokens, validated after the first
    and the last, no logger files. It goes with every mode, launcher and sweep, and a key given on
    the command line still wins."""
    run = shared_run(["debug=smoke"])
    records = assert_trained(run.result, run.run_dir, steps=3)
    assert sorted(r["step"] for r in records if "val_loss" in r) == [1, 3]
    assert records[-1]["tokens_seen"] == 3 * 2 * 64 and read_summary(run.run_dir)["status"] == "completed"
    assert not (run.run_dir / "wandb").exists() and not list(run.run_dir.rglob("events.out.tfevents.*"))

    wins = compose_config(["debug=smoke", "logger=wandb", "training.steps=8"])
    assert wins.training.steps == 8 and list(wins.logger.backends) == ["wandb"]
    # every mode with its own default model (nki_moe: tiny_moe), on Slurm, as a planned sweep
    sweep = tmp_path / "sweep"
    every_mode_on_slurm = ["debug=smoke", "backend=native,hf_v5,nki_moe", "launcher=slurm", "launcher.partition=cpu"]
    planned = command_in_process(["-m", "mode=plan", *every_mode_on_slurm, f"hydra.sweep.dir={sweep}"])
    assert planned.returncode == 0, planned.stderr[-3000:]
    manifest = read_manifest(sweep)
    assert manifest["counts"]["planned"] == 3, manifest["counts"]
    for job in manifest["jobs"]:
        config = compose_config(job["overrides"])
        assert (config.training.steps, config.training.seq_len, list(config.logger.backends)) == (3, 64, []), job["overrides"]
        assert config.model.flavor == ("debugmodel_moe" if "backend=nki_moe" in job["overrides"] else "debugmodel")


def test_native_moe_trains(run_dir):
    result = command_in_process(["model=tiny_moe", *FAST], run_dir)
    records = assert_trained(result, run_dir, steps=6)
    assert _falls(records), [r["loss"] for r in records]
    assert read_summary(run_dir)["architecture"]["num_experts"] == 8


# 2 ranks, FSDP over gloo, checkpoints every 2 steps: the run the multi-rank test reads and the
# uninterrupted reference of the resume test.
FSDP = [
    "launcher.nproc_per_node=2",
    "parallelism=fsdp",
    "checkpoint=on",
    "checkpoint.interval=2",
    "checkpoint.keep_latest_k=0",
    "training.seq_len=64",
    "optimizer.warmup_steps=2",
    "logger=none",
    "training.steps=7",
]


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    run_dir = tmp_path_factory.mktemp("fsdp") / "run"
    return command_in_subprocess(FSDP, run_dir), run_dir


def test_two_rank_fsdp_on_gloo(fsdp_run):
    result, run_dir = fsdp_run
    records = assert_trained(result, run_dir, steps=7)
    assert _falls(records), [r["loss"] for r in records]
    summary = read_summary(run_dir)
    assert summary["world_size"] == 2 and "dp_shard=2" in summary["layout"]
    assert (run_dir / "logs" / "rank0.log").is_file() and (run_dir / "logs" / "rank1.log").is_file()
    # only rank 0 reports to the console
    assert "[rank1]" not in result.stdout


def test_killed_fsdp_run_resumes_with_the_losses_of_an_uninterrupted_one(fsdp_run, tmp_path, monkeypatch):
    """2 ranks, FSDP over gloo. A run killed with SIGKILL between checkpoints and resumed from
    its run directory, given relative to where the command runs (the README's
    ``checkpoint.resume_from=outputs/runs/<date>/<time>``), logs exactly the losses of a run that
    was never interrupted at every later step. (Absolute paths: the resume tests in
    tests/test_reliability.py and the Slurm requeue test.)"""
    reference_result, reference = fsdp_run  # never interrupted
    uninterrupted = {r["step"]: r["loss"] for r in assert_trained(reference_result, reference, steps=7)}
    killed = tmp_path / "outputs" / "runs" / "killed"
    run = start_command(FSDP, killed, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 600
    while not ((killed / "checkpoint" / "step-4" / ".metadata").is_file() and any(r["step"] == 5 for r in _records(killed))):
        assert run.poll() is None and time.monotonic() < deadline, "the run ended before step 5"
        time.sleep(0.05)
    os.killpg(run.pid, signal.SIGKILL)
    run.wait(timeout=60)
    assert not (killed / "checkpoint" / "step-6" / ".metadata").exists(), "killed after the next checkpoint, not between two"

    # resumed through the command's entry point in this process, working in the same directory
    resumed = tmp_path / "outputs" / "runs" / "resumed"
    monkeypatch.chdir(tmp_path)
    result = command_in_process([*FSDP, "checkpoint.resume_from=outputs/runs/killed"], resumed)
    records = assert_trained(result, resumed, steps=3)
    assert {r["step"]: r["loss"] for r in records} == {step: uninterrupted[step] for step in (5, 6, 7)}
    assert f"resume_from: {killed}" in (resumed / "config.yaml").read_text(), "saved as the absolute path"
    assert read_summary(resumed)["resumed_from"] == str(killed / "checkpoint" / "step-4")

    assert [r["step"] for r in read_metrics(killed)][-1] >= 5, "the killed run's records stay as they were"


def _records(run_dir):
    try:
        return read_metrics(run_dir)
    except (OSError, ValueError):  # not there yet, or a line being written
        return []


def test_a_resumed_start_drops_the_lines_after_its_checkpoint_and_a_torn_last_line(tmp_path):
    """A start resumed from step 2 of a run that was killed while writing step 4: the file keeps
    steps 1-2 of the first start and goes on with the resumed ones, each step once."""
    from qwen3_trn.run.metrics import JsonlLogger

    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "loss": float(s)}) + "\n" for s in (1, 2, 3)) + '{"step": 4, "lo')
    logger = JsonlLogger(path, data_parallel=1, launch_time=None)
    logger._write({"step": 3, "loss": 30.0})
    logger._file.close()
    assert [json.loads(line) for line in path.read_text().splitlines()] == [
        {"step": 1, "loss": 1.0},
        {"step": 2, "loss": 2.0},
        {"step": 3, "loss": 30.0},
    ]


def test_the_progress_bar_on_a_terminal_is_drawn_by_the_logged_steps_not_a_thread(monkeypatch):
    """On a terminal the bar starts no refresh thread beside the training loop: it is drawn when
    it starts, when a step is logged (at most every REDRAW_S) and once more, in its last state,
    when training ends."""
    import pty
    import threading

    from qwen3_trn.run.metrics import ProgressLogger

    master, replica = pty.openpty()
    terminal = os.fdopen(replica, "w")
    monkeypatch.setattr(sys, "stdout", terminal)
    threads = set(threading.enumerate())
    progress = ProgressLogger(total_steps=50, data_parallel=1)
    assert set(threading.enumerate()) == threads
    for step in range(1, 51):  # all well within REDRAW_S
        progress.log({"loss_metrics/global_avg_loss": 7.0 - step / 100, "throughput(tps)": 1000.0}, step)
    progress.close()
    monkeypatch.undo()
    terminal.close()
    os.set_blocking(master, False)
    drawn = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except (BlockingIOError, OSError):  # OSError: EIO once the terminal's other end is closed
            break
        if not chunk:
            break
        drawn += chunk
    os.close(master)
    text = drawn.decode(errors="replace")
    assert text.count("tok/s") == 3, text  # at the start, at step 1, at the end
    assert "50/50" in text and "6.5000" in text, text
