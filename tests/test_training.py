"""Real training on the CPU through the command line users run."""

from __future__ import annotations

import json

import pytest

from tests.conftest import FAST, assert_trained, read_metrics, read_summary, run_cli

pytestmark = pytest.mark.slow


def _falls(records, by=0.2):
    return records[-1]["loss"] < records[0]["loss"] - by


def test_default_run_trains_offline_and_reports(run_dir):
    result = run_cli([], run_dir)
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


def test_native_moe_trains(run_dir):
    result = run_cli(["model=tiny_moe", *FAST], run_dir)
    records = assert_trained(result, run_dir, steps=6)
    assert _falls(records), [r["loss"] for r in records]
    assert read_summary(run_dir)["architecture"]["num_experts"] == 8


def test_two_rank_fsdp_on_gloo(run_dir):
    result = run_cli(["launcher.nproc_per_node=2", "parallelism=fsdp", *FAST], run_dir)
    records = assert_trained(result, run_dir, steps=6)
    assert _falls(records), [r["loss"] for r in records]
    summary = read_summary(run_dir)
    assert summary["world_size"] == 2 and "dp_shard=2" in summary["layout"]
    assert (run_dir / "logs" / "rank0.log").is_file() and (run_dir / "logs" / "rank1.log").is_file()
    # only rank 0 reports to the console
    assert "[rank1]" not in result.stdout


def test_checkpoint_resume_continues_step_count(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    common = ["checkpoint=on", "checkpoint.interval=2", "training.seq_len=128", "optimizer.warmup_steps=2"]
    assert_trained(run_cli([*common, "training.steps=4"], first), first, steps=4)
    assert (first / "checkpoint" / "step-4").is_dir()
    result = run_cli([*common, "training.steps=7", f"checkpoint.resume_from={first}"], second)
    records = assert_trained(result, second, steps=3)
    assert records[0]["step"] == 5 and records[-1]["step"] == 7
    # the resumed run starts where the first one ended, not from a fresh model
    assert records[0]["loss"] < read_metrics(first)[0]["loss"] - 0.2
    assert [r["step"] for r in read_metrics(first)] == [1, 2, 3, 4]
