"""Framework overhead: ``python -m qwen3_trn`` against the same Trainer.Config run directly
with torchtitan's Python API, alternating runs in one session.

    python benchmarks/framework_overhead.py [--pairs 3] [key=value ...]

Prints, per path, medians over its runs: time from command to the first logged step and the
CPU time the process had used by then; steady tokens/s as torchtitan reports it (its window
excludes the loggers' own work); the steady step as the wall clock sees it (the median interval
between consecutive logged steps, loggers included); the CPU time per steady step (the
process's own, read from /proc when each step's line reaches this script: on a machine that
other work loads, the wall clock measures the load, the CPU time what the process did); and the
CPU time of the whole command. Both paths stamp their steps inside torchtitan's
``MetricsProcessor.log`` and count the same steps: every step after the first (CPU: after the
second, the first interval's start being step 2's line). The ratios come from each pair's two
adjacent runs, whose median is printed beside the ratio of the medians: a machine whose load
drifts moves both runs of a pair alike. Also printed: the load average during the runs, and
whether the loss curves are identical for the same seed.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]
_TICK = os.sysconf("SC_CLK_TCK")


@dataclass
class Run:
    steps: list[dict]
    step_cpu_s: list[float]
    """The process's CPU time when each step's line was read."""
    cpu_s: float
    load: float

    @property
    def first_step_s(self) -> float:
        return self.steps[0]["seconds_since_launch"]

    @property
    def first_step_cpu_s(self) -> float:
        return self.step_cpu_s[0]

    @property
    def titan_tps(self) -> float:
        return statistics.mean(r["tps"] for r in self.steps[1:])

    @property
    def wall_step_s(self) -> float:
        times = [r["seconds_since_launch"] for r in self.steps]
        return statistics.median(b - a for a, b in zip(times[1:], times[2:]))

    @property
    def cpu_step_s(self) -> float:
        return (self.step_cpu_s[-1] - self.step_cpu_s[1]) / (len(self.step_cpu_s) - 2)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _process_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime


def _run(cmd: list[str], is_step_line: Callable[[str], bool]) -> tuple[list[str], list[float], float, float]:
    """The command's stdout lines, its CPU time as each step line arrived, its CPU seconds in
    all (children included), and the 1-minute load average when it ended."""
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "QWEN3_TRN_LAUNCH_TIME": str(time.time()),
    }
    cpu = _children_cpu()
    with tempfile.TemporaryFile("w+") as stderr:
        process = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=stderr, text=True, env=env)
        lines, step_cpu = [], []
        for line in process.stdout:
            if is_step_line(line):
                step_cpu.append(_process_cpu(process.pid))
            lines.append(line)
        if process.wait():
            stderr.seek(0)
            sys.exit(f"failed: {' '.join(cmd)}\n{stderr.read()[-3000:]}")
    return lines, step_cpu, _children_cpu() - cpu, os.getloadavg()[0]


def framework(overrides: list[str], out: Path) -> Run:
    cmd = [sys.executable, "-m", "qwen3_trn", *overrides, f"hydra.run.dir={out}"]
    _, step_cpu, cpu, load = _run(cmd, lambda line: line.startswith("step ") and " loss " in line)
    steps = [
        {"step": r["step"], "loss": r["loss"], "tps": r["tokens_per_s"], "seconds_since_launch": r["seconds_since_launch"]}
        for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
    ]
    return Run(steps, step_cpu, cpu, load)


def direct(overrides: list[str], out: Path) -> Run:
    cmd = [sys.executable, str(REPO / "benchmarks" / "titan_direct.py"), str(out), *overrides]
    lines, step_cpu, cpu, load = _run(cmd, lambda line: line.startswith("{"))
    return Run([json.loads(line) for line in lines if line.startswith("{")], step_cpu, cpu, load)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("overrides", nargs="*", default=["training.steps=30"])
    args = parser.parse_args()
    results: dict[str, list[Run]] = {"qwen3_trn": [], "torchtitan": []}
    start_load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        for pair in range(args.pairs):
            for name, fn in (
                (("torchtitan", direct), ("qwen3_trn", framework)) if pair % 2 else (("qwen3_trn", framework), ("torchtitan", direct))
            ):
                results[name].append(fn(args.overrides, Path(tmp) / f"{name}-{pair}"))
    loads = [start_load] + [run.load for runs in results.values() for run in runs]
    print("runs in order (first step s / its CPU s / wall step ms / CPU per step ms / load):")
    for pair, runs in enumerate(zip(results["qwen3_trn"], results["torchtitan"])):
        print(
            f"  pair {pair}: "
            + "   ".join(
                f"{name} {r.first_step_s:.2f} / {r.first_step_cpu_s:.2f} / {1000 * r.wall_step_s:.1f} / {1000 * r.cpu_step_s:.1f} / {r.load:.2f}"
                for name, r in zip(results, runs)
            )
        )
    print(
        f"{'path':<12} {'to first step (s)':>18} {'its CPU (s)':>12} {'steady tokens/s':>16} {'wall step (ms)':>15} "
        f"{'CPU/step (ms)':>14} {'CPU (s)':>8}"
    )
    for name, runs in results.items():
        m = _MedianRun(runs)
        print(
            f"{name:<12} {m.first_step_s:>18.2f} {m.first_step_cpu_s:>12.2f} {m.titan_tps:>16.0f} {1000 * m.wall_step_s:>15.1f} "
            f"{1000 * m.cpu_step_s:>14.1f} {m.cpu_s:>8.2f}"
        )
    pairs = list(zip(results["qwen3_trn"], results["torchtitan"]))
    medians = (_MedianRun(results["qwen3_trn"]), _MedianRun(results["torchtitan"]))
    for label, of, form in (
        ("start-up overhead (s)", lambda f, d: f.first_step_s - d.first_step_s, "+.2f"),
        ("start-up overhead, CPU (s)", lambda f, d: f.first_step_cpu_s - d.first_step_cpu_s, "+.2f"),
        ("tokens/s ratio, torchtitan's measure", lambda f, d: f.titan_tps / d.titan_tps, ".3f"),
        ("tokens/s ratio, wall clock", lambda f, d: d.wall_step_s / f.wall_step_s, ".3f"),
        ("tokens/s ratio, CPU time per step", lambda f, d: d.cpu_step_s / f.cpu_step_s, ".3f"),
        ("CPU overhead of the command (s)", lambda f, d: f.cpu_s - d.cpu_s, "+.2f"),
    ):
        print(
            f"{label + ':':<38} {statistics.median(of(f, d) for f, d in pairs):{form}} (median of pairs), {of(*medians):{form}} (of the medians)"
        )
    print(f"load average (1 min) during the runs: {min(loads):.2f}-{max(loads):.2f}, median {statistics.median(loads):.2f}")
    # torchtitan's log line carries 5 decimals: equal within its rounding means identical.
    same = all(
        len(a.steps) == len(b.steps) and all(abs(x["loss"] - y["loss"]) <= 5e-6 for x, y in zip(a.steps, b.steps))
        for a in results["qwen3_trn"]
        for b in results["torchtitan"]
    )
    print(f"loss curves identical (to torchtitan's 5 logged decimals, same seed): {same}")


class _MedianRun:
    """The medians of a path's runs, read like one run."""

    def __init__(self, runs: list[Run]) -> None:
        self.first_step_s = statistics.median(r.first_step_s for r in runs)
        self.titan_tps = statistics.median(r.titan_tps for r in runs)
        self.wall_step_s = statistics.median(r.wall_step_s for r in runs)
        self.first_step_cpu_s = statistics.median(r.first_step_cpu_s for r in runs)
        self.cpu_step_s = statistics.median(r.cpu_step_s for r in runs)
        self.cpu_s = statistics.median(r.cpu_s for r in runs)


if __name__ == "__main__":
    main()
