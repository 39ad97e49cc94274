"""The loss differences between training modes that compute the same model in another order:
the numbers behind ``qwen3_trn.compare.MEASURED``.

    python benchmarks/parity_tolerance.py [--steps 10] [key=value ...]

Runs the parity command (``python -m qwen3_trn.compare``, accepting any difference) on
``model=tiny`` and ``model=tiny_moe`` with ``debug=smoke`` for ``--steps`` steps, in bf16 and in
fp32 compute (``training.mixed_precision_param``), from two starts: the native init, and a
checkpoint of 40 native steps (``checkpoint=hf_export``), where a fresh AdamW's first full-size
step turns small gradient differences into whole updates. Prints per mode math, compute dtype,
model kind and start the largest |loss difference| to native over every step.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from qwen3_trn.compare import compare, modes_for

TRAINED_STEPS = 40


def trained_checkpoint(model: str, out: Path) -> Path:
    """The HF export of a native run of TRAINED_STEPS steps."""
    overrides = [f"model={model}", "debug=smoke", f"training.steps={TRAINED_STEPS}", "validation=off", "checkpoint=hf_export"]
    subprocess.run([sys.executable, "-m", "qwen3_trn", *overrides, f"hydra.run.dir={out}"], check=True, capture_output=True)
    return out / "hf" / f"step-{TRAINED_STEPS}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    math_of = {mode.name: mode.math for mode in modes_for(moe=True, device="cpu")}
    largest: dict[tuple[str, str, str, str], float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for model in ("tiny", "tiny_moe"):
            starts = {
                "init": [],
                "checkpoint": [f"checkpoint.initial_load_path={trained_checkpoint(model, Path(tmp) / f'{model}-trained')}"],
            }
            for start, load in starts.items():
                for dtype in ("bfloat16", "float32"):
                    overrides = ["debug=smoke", f"model={model}", f"training.steps={args.steps}", "validation=off"]
                    overrides += [f"training.mixed_precision_param={dtype}", *load, *args.overrides]
                    parity = compare(overrides, Path(tmp) / f"{model}-{start}-{dtype}", tolerance=float("inf"))
                    kind = "moe" if model == "tiny_moe" else "dense"
                    for pair in parity.pairs:
                        key = (math_of.get(pair.mode, pair.mode), parity.compute_dtype, kind, start)
                        print(
                            f"{model:9s} {start:10s} {dtype:9s} {pair.mode:20s} largest |diff| {pair.largest_diff:.3e} at step {pair.largest_at}"
                        )
                        largest[key] = max(largest.get(key, 0.0), pair.largest_diff or 0.0)
    print("\nlargest per (math, compute dtype, model kind, start):")
    for key, value in sorted(largest.items()):
        print(f"    {key!r}: {value:.1e},")


if __name__ == "__main__":
    main()
