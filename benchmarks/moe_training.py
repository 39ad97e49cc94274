"""Training throughput of backend=nki_moe (kernel-backed experts) against backend=native
(torchtitan's GroupedExperts) on the same MoE architecture, alternating runs.

    python benchmarks/moe_training.py [--pairs 2] [key=value ...]

Default architecture: model=debugmodel_moe cut to 2 layers (64 experts, top-8, dim 256).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT = ["model=debugmodel_moe", "model.n_layers=2", "training.steps=8", "training.seq_len=256", "logger=none"]


def run(backend: str, overrides: list[str], out: Path) -> dict:
    cmd = [sys.executable, "-m", "qwen3_trn", f"backend={backend}", *overrides, f"hydra.run.dir={out}"]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if done.returncode:
        sys.exit(f"failed: {' '.join(cmd)}\n{done.stderr[-3000:]}")
    return json.loads((out / "summary.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("overrides", nargs="*", default=DEFAULT)
    args = parser.parse_args()
    tps: dict[str, list[float]] = {"native": [], "nki_moe": []}
    kernel = "?"
    with tempfile.TemporaryDirectory() as tmp:
        for pair in range(args.pairs):
            order = ("native", "nki_moe") if pair % 2 == 0 else ("nki_moe", "native")
            for backend in order:
                summary = run(backend, args.overrides, Path(tmp) / f"{backend}-{pair}")
                tps[backend].append(summary["tokens_per_s"])
                kernel = summary.get("kernel", kernel)
    native, nki = statistics.median(tps["native"]), statistics.median(tps["nki_moe"])
    print(f"architecture: {' '.join(args.overrides)}")
    print(f"backend=native  (torchtitan GroupedExperts): {native:10.0f} tokens/s  runs {tps['native']}")
    print(f"backend=nki_moe (kernel {kernel}): {nki:10.0f} tokens/s  runs {tps['nki_moe']}")
    print(f"speed-up: {nki / native:.2f}x")


if __name__ == "__main__":
    main()
