"""What validation costs a run: ``python -m qwen3_trn`` with ``validation=on`` (the default) and
``validation=off``, alternating in one session.

    python benchmarks/validation_cost.py [--pairs 3] [key=value ...]

Prints, per setting, the median wall time of the whole command, the median training loss of
the last step (identical: validation does not change training) and the final val_loss.
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


def run(overrides: list[str], out: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "qwen3_trn", *overrides, f"hydra.run.dir={out}"],
        check=False,
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env,
    )
    wall = time.perf_counter() - started
    if done.returncode:
        sys.exit(f"failed: {' '.join(overrides)}\n{done.stderr[-3000:]}")
    summary = json.loads((out / "summary.json").read_text())
    return {"wall_s": wall, "last_loss": summary["last_loss"], "val_loss": summary.get("val_loss"), "tokens_per_s": summary["tokens_per_s"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("overrides", nargs="*", default=["logger=none"])
    args = parser.parse_args()
    settings = {"on": ["validation=on"], "off": ["validation=off"]}
    results: dict[str, list[dict]] = {name: [] for name in settings}
    with tempfile.TemporaryDirectory() as tmp:
        for pair in range(args.pairs):
            order = list(settings) if pair % 2 == 0 else list(reversed(settings))
            for name in order:
                results[name].append(run([*args.overrides, *settings[name]], Path(tmp) / f"{name}-{pair}"))
    print(f"{'validation':<10} {'wall time (s)':>14} {'tokens/s':>10} {'last loss':>10} {'val loss':>10}")
    for name, runs in results.items():
        wall = statistics.median(r["wall_s"] for r in runs)
        tps = statistics.median(r["tokens_per_s"] for r in runs)
        loss = statistics.median(r["last_loss"] for r in runs)
        val = runs[-1]["val_loss"]
        print(f"{name:<10} {wall:>14.1f} {tps:>10,.0f} {loss:>10.4f} {'-' if val is None else f'{val:.4f}':>10}")
    on, off = (statistics.median(r["wall_s"] for r in results[n]) for n in ("on", "off"))
    print(f"validation adds {on - off:+.1f} s ({(on / off - 1) * 100:+.0f} %) to the run")


if __name__ == "__main__":
    main()
