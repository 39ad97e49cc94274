"""Framework overhead: ``python -m qwen3_trn`` against the same Trainer.Config run directly
with torchtitan's Python API, alternating runs in one session.

    python benchmarks/framework_overhead.py [--pairs 3] [key=value ...]

Prints, per path: time from command to the first logged step, steady-state tokens/s
(steps after the first), and whether the loss curves are identical for the same seed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _run(cmd: list[str], env_extra: dict[str, str]) -> tuple[list[dict], str]:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        **env_extra,
        "QWEN3_TRN_LAUNCH_TIME": str(time.time()),
    }
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env)
    if done.returncode:
        sys.exit(f"failed: {' '.join(cmd)}\n{done.stderr[-3000:]}")
    return [], done.stdout


def framework(overrides: list[str], out: Path) -> list[dict]:
    _run([sys.executable, "-m", "qwen3_trn", *overrides, f"hydra.run.dir={out}"], {})
    return [
        {"step": r["step"], "loss": r["loss"], "tps": r["tokens_per_s"], "seconds_since_launch": r["seconds_since_launch"]}
        for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
    ]


def direct(overrides: list[str], out: Path) -> list[dict]:
    _, stdout = _run([sys.executable, str(REPO / "benchmarks" / "titan_direct.py"), str(out), *overrides], {})
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("overrides", nargs="*", default=["training.steps=30"])
    args = parser.parse_args()
    results: dict[str, list[list[dict]]] = {"qwen3_trn": [], "torchtitan": []}
    with tempfile.TemporaryDirectory() as tmp:
        for pair in range(args.pairs):
            for name, fn in (
                (("torchtitan", direct), ("qwen3_trn", framework)) if pair % 2 else (("qwen3_trn", framework), ("torchtitan", direct))
            ):
                results[name].append(fn(args.overrides, Path(tmp) / f"{name}-{pair}"))
    print(f"{'path':<12} {'to first step (s)':>18} {'steady tokens/s':>16}")
    summary = {}
    for name, runs in results.items():
        first = statistics.median(run[0]["seconds_since_launch"] for run in runs)
        steady = statistics.median(statistics.mean(r["tps"] for r in run[1:]) for run in runs)
        summary[name] = (first, steady)
        print(f"{name:<12} {first:>18.2f} {steady:>16.0f}")
    (f_first, f_tps), (d_first, d_tps) = summary["qwen3_trn"], summary["torchtitan"]
    print(f"start-up overhead: {f_first - d_first:+.2f} s   tokens/s ratio: {f_tps / d_tps:.3f}")
    # torchtitan's log line carries 5 decimals: equal within its rounding means identical.
    same = all(
        len(a) == len(b) and all(abs(x["loss"] - y["loss"]) <= 5e-6 for x, y in zip(a, b))
        for a in results["qwen3_trn"]
        for b in results["torchtitan"]
    )
    print(f"loss curves identical (to torchtitan's 5 logged decimals, same seed): {same}")


if __name__ == "__main__":
    main()
