"""Device packing: concurrent jobs get disjoint device slices; a job waits while none is free."""

from __future__ import annotations

import json
import multiprocessing
import time
from pathlib import Path

import pytest

from qwen3_trn.common.errors import ConfigError
from qwen3_trn.launch.packing import DeviceSlots
from qwen3_trn.results.records import read_summary, run_dirs_under
from tests.commands import command_in_subprocess


def _hold(lock_dir: str, total: int, log: str, hold_s: float) -> None:
    with DeviceSlots(Path(lock_dir), total).claim(1) as slots:
        start = time.time()
        time.sleep(hold_s)
        with open(log, "a") as f:
            f.write(json.dumps({"slots": slots, "start": start, "end": time.time()}) + "\n")


def _overlapping(a: dict, b: dict) -> bool:
    return a["start"] < b["end"] and b["start"] < a["end"]


def _max_concurrency(intervals: list[dict]) -> int:
    events = sorted([(i["start"], 1) for i in intervals] + [(i["end"], -1) for i in intervals], key=lambda e: (e[0], e[1]))
    running = peak = 0
    for _, change in events:
        running += change
        peak = max(peak, running)
    return peak


def test_claims_are_disjoint_and_wait_when_full(tmp_path):
    log = tmp_path / "log.jsonl"
    # forked: the claims need processes of their own, not a fresh interpreter each (importing
    # qwen3_trn.launch again in each of four processes costs more than the test)
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_hold, args=(str(tmp_path / "locks"), 2, str(log), 1.0)) for _ in range(4)]
    started = time.time()
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    claims = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(claims) == 4
    for i, a in enumerate(claims):
        for b in claims[i + 1 :]:
            if _overlapping(a, b):
                assert a["slots"] != b["slots"]
    # never more than 2 at once, so 4 jobs of 1 s take at least 2 s
    assert _max_concurrency(claims) == 2
    assert time.time() - started >= 2.0


def test_more_devices_than_the_machine_has_is_refused(tmp_path):
    with pytest.raises(ConfigError) as info:
        with DeviceSlots(tmp_path, 2).claim(3):
            pass
    assert info.value.key == "launcher.devices_per_job"


@pytest.mark.slow
def test_packed_sweep_of_four_jobs_on_two_cores(tmp_path):
    sweep_dir = tmp_path / "sweep"
    result = command_in_subprocess(
        [
            "-m",
            "hydra/launcher=joblib",
            "hydra.launcher.n_jobs=2",
            "launcher.devices_per_job=1",
            "logger=none",
            "training.steps=3",
            "optimizer.warmup_steps=1",
            "training.seq_len=64",
            "training.seed=1,2,3,4",
            f"hydra.sweep.dir={sweep_dir}",
        ],
        env={"QWEN3_TRN_SLOTS_DIR": str(tmp_path / "slots")},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    slices = [json.loads(p.read_text()) for p in sorted(sweep_dir.glob("*/device_slice.json"))]
    assert len(slices) == 4 and all(len(s["slots"]) == 1 for s in slices)
    for s in slices:
        s["start"], s["end"] = s["started"], s["finished"]
    for i, a in enumerate(slices):
        for b in slices[i + 1 :]:
            if _overlapping(a, b):
                assert a["slots"] != b["slots"], "two running jobs shared a core"
    assert _max_concurrency(slices) <= 2
    for run_dir in run_dirs_under(sweep_dir):
        assert read_summary(run_dir)["status"] == "completed"
