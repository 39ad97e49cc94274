"""The loss differences between training modes that compute the same model in another order:
the numbers behind ``qwen3_trn.compare.MEASURED``.

    python benchmarks/parity_tolerance.py [--steps 10] [key=value ...]

Runs the parity command (``python -m qwen3_trn.compare``, accepting any difference) on
``model=tiny`` and ``model=tiny_moe`` with ``debug=smoke`` for ``--steps`` steps, in bf16 and in
fp32 compute (``training.mixed_precision_param``), and prints per mode math, compute dtype and model kind
the largest |loss difference| to native over every step.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from qwen3_trn.compare import compare, modes_for


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    math_of = {mode.name: mode.math for mode in modes_for(moe=True, device="cpu")}
    largest: dict[tuple[str, str, str], float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for model in ("tiny", "tiny_moe"):
            for dtype in ("bfloat16", "float32"):
                overrides = ["debug=smoke", f"model={model}", f"training.steps={args.steps}", "validation=off"]
                overrides += [f"training.mixed_precision_param={dtype}", *args.overrides]
                parity = compare(overrides, Path(tmp) / f"{model}-{dtype}", tolerance=float("inf"))
                for pair in parity.pairs:
                    key = (math_of.get(pair.mode, pair.mode), parity.compute_dtype, "moe" if model == "tiny_moe" else "dense")
                    print(f"{model:9s} {dtype:9s} {pair.mode:20s} largest |diff| {pair.largest_diff:.3e} at step {pair.largest_at}")
                    largest[key] = max(largest.get(key, 0.0), pair.largest_diff or 0.0)
    print("\nlargest per (math, compute dtype, model kind):")
    for (math_name, dtype, kind), value in sorted(largest.items()):
        print(f"    ({math_name!r}, {dtype!r}, {kind!r}): {value:.1e},")


if __name__ == "__main__":
    main()
