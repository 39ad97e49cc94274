"""The smallest valid run of each kind trains with every other setting at its default: no
default (warm-up, validation, checkpoint interval, keep_latest_k, batch sizes) is a trap for a
one-step run, and no run directory is left with an empty folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from qwen3_trn.results.records import read_metrics, read_summary
from tests.commands import command_in_process, command_in_subprocess


def empty_folders(run_dir: Path) -> list[str]:
    return [str(p) for p in Path(run_dir).rglob("*") if p.is_dir() and not any(p.iterdir())]


def assert_one_step(run_dir: Path) -> dict:
    assert [r["step"] for r in read_metrics(run_dir)] == [1]
    summary = read_summary(run_dir)
    assert summary["status"] == "completed", summary
    assert not empty_folders(run_dir), empty_folders(run_dir)
    return summary


@pytest.mark.slow
def test_one_step_with_every_default_from_the_command_line(run_dir):
    """``python -m qwen3_trn training.steps=1``: native Qwen3, wandb offline, validation on."""
    result = command_in_subprocess(["training.steps=1"], run_dir, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = assert_one_step(run_dir)
    assert summary["val_step"] == 1 and summary["val_loss"] > 0
    assert any(run_dir.glob("wandb/offline-run-*/run-*.wandb"))


SMALLEST = {
    # every backend and every checkpoint, logger and layout option at one step
    "hf_v5-hf_export-tensorboard": ["backend=hf_v5", "checkpoint=hf_export", "logger=tensorboard"],
    "nki_moe-checkpoint": ["backend=nki_moe", "checkpoint=on", "logger=none"],
    "fsdp-2-ranks": ["launcher.nproc_per_node=2", "parallelism=fsdp", "logger=none"],
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(SMALLEST), ids=list(SMALLEST))
def test_one_step_of_each_kind(case, run_dir):
    done = command_in_process(["training.steps=1", *SMALLEST[case]], run_dir)
    assert done.returncode == 0, done.stderr[-3000:]
    assert_one_step(run_dir)
    if "checkpoint=on" in SMALLEST[case]:
        assert (run_dir / "checkpoint" / "step-1" / ".metadata").is_file()  # the last step is saved
    if "checkpoint=hf_export" in SMALLEST[case]:
        assert (run_dir / "hf" / "step-1" / "config.json").is_file()
    if "logger=tensorboard" in SMALLEST[case]:
        assert any(run_dir.rglob("events.out.tfevents.*"))


@pytest.mark.slow
def test_one_step_sweep(tmp_path):
    """Through the command's entry point in this process (a sweep as a real process:
    tests/test_sweep.py)."""
    sweep = tmp_path / "sweep"
    result = command_in_process(["-m", "training.steps=1", "logger=none", "training.seed=1,2", f"hydra.sweep.dir={sweep}"])
    assert result.returncode == 0, result.stderr[-3000:]
    for job in ("0", "1"):
        assert_one_step(sweep / job)
