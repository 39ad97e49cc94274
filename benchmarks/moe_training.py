"""MoE training efficiency against the dense model, side by side: tokens/s and MFU of
``backend=nki_moe`` (project kernels), ``backend=native`` (torchtitan's GroupedExperts) and the
dense debugmodel, each a real ``python -m qwen3_trn`` run, in alternating order.

    python benchmarks/moe_training.py                               # the headline comparison
    python benchmarks/moe_training.py --pairs 5 --baseline-checkout /tmp/before
    python benchmarks/moe_training.py --grid                        # top_k x num_experts table

Headline: ``model=debugmodel_moe model.n_layers=2`` (64 experts, top-8) against
``model=debugmodel model.n_layers=2``, default batch (2 x 256 tokens). Each round runs every
configuration once, the order rotating between rounds; the tables print medians over rounds
and every run's figure, so a shared machine's load falls on all configurations alike.
``--glibc`` adds ``backend=nki_moe`` under tuned glibc malloc (``QWEN3_TRN_HOST_ALLOCATOR=glibc``)
instead of the tcmalloc the command restarts under where it is installed. ``--baseline-checkout DIR`` adds ``backend=nki_moe`` run from another checkout of this project
(e.g. ``git worktree add /tmp/before <rev>``) to the same rounds. ``--grid`` measures
backend=native against backend=nki_moe over top_k in {1, 2, 4, 8} and 16-128 experts.

MFU is torchtitan's, against this machine's measured matmul peak in the training dtype (the
same cached figure for every run here, so ratios compare like with like).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

# Not inprocess: this script starts commands, and must not restart under the runs' allocator.
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from qwen3_trn.common.allocator import HOST_ALLOCATOR_ENV

COMMON = ["model.n_layers=2", "training.seq_len=256", "logger=none"]
MOE = ["model=debugmodel_moe"]


@dataclass(frozen=True)
class RunSpec:
    label: str
    overrides: tuple[str, ...]
    checkout: Path = REPO
    env: tuple[tuple[str, str], ...] = ()


@dataclass
class Runs:
    tokens_per_s: list[float] = field(default_factory=list)
    mfu_pct: list[float] = field(default_factory=list)
    kernel: str = "-"

    @property
    def tps(self) -> float:
        return statistics.median(self.tokens_per_s)

    @property
    def mfu(self) -> float:
        return statistics.median(self.mfu_pct)


def run(spec: RunSpec, extra: list[str], out: Path) -> dict:
    cmd = [sys.executable, "-m", "qwen3_trn", *spec.overrides, *extra, f"hydra.run.dir={out}"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(spec.checkout), **dict(spec.env)}
    done = subprocess.run(cmd, check=False, cwd=spec.checkout, capture_output=True, text=True, env=env)
    if done.returncode:
        sys.exit(f"failed (in {spec.checkout}): {' '.join(cmd)}\n{done.stderr[-3000:]}")
    return json.loads((out / "summary.json").read_text())


def measure(specs: list[RunSpec], extra: list[str], rounds: int) -> dict[str, Runs]:
    results = {spec.label: Runs() for spec in specs}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(rounds):
            shift = round_ % len(specs)
            for spec in specs[shift:] + specs[:shift]:
                summary = run(spec, extra, Path(tmp) / f"{specs.index(spec)}-{round_}")
                runs = results[spec.label]
                runs.tokens_per_s.append(summary["tokens_per_s"])
                runs.mfu_pct.append(summary["mfu_pct"])
                runs.kernel = summary.get("kernel", runs.kernel)
    return results


def _figures(values: list[float], digits: int) -> str:
    return "[" + ", ".join(f"{v:.{digits}f}" for v in values) + "]"


def headline(args: argparse.Namespace) -> None:
    specs = [
        RunSpec("dense (native)", ("backend=native", "model=debugmodel", *COMMON)),
        RunSpec("MoE native", ("backend=native", *MOE, *COMMON)),
        RunSpec("MoE nki_moe", ("backend=nki_moe", *MOE, *COMMON)),
    ]
    if args.glibc:
        specs.append(RunSpec("MoE nki_moe, glibc", ("backend=nki_moe", *MOE, *COMMON), env=((HOST_ALLOCATOR_ENV, "glibc"),)))
    if args.baseline_checkout:
        specs.append(RunSpec("MoE nki_moe, baseline", ("backend=nki_moe", *MOE, *COMMON), args.baseline_checkout))
    extra = [f"training.steps={args.steps}", *args.overrides]
    results = measure(specs, extra, args.pairs)
    print(
        f"{args.pairs} rounds, order rotating; {' '.join(COMMON + extra)}; load average {os.getloadavg()[0]:.2f} "
        "(shared machine: medians over rounds)"
    )
    print(f"{'run':26s} {'kernel':14s} {'tokens/s':>9s} {'MFU %':>7s}  runs tokens/s | MFU %")
    for label, runs in results.items():
        print(
            f"{label:26s} {runs.kernel:14s} {runs.tps:9.0f} {runs.mfu:7.2f}  {_figures(runs.tokens_per_s, 0)} | {_figures(runs.mfu_pct, 2)}"
        )
    dense, native, ours = results["dense (native)"], results["MoE native"], results["MoE nki_moe"]
    print(f"nki_moe / dense:  MFU ratio {ours.mfu / dense.mfu:.2f} (target >= 0.80), tokens/s ratio {ours.tps / dense.tps:.2f}")
    print(f"nki_moe / native: MFU ratio {ours.mfu / native.mfu:.2f}, tokens/s ratio {ours.tps / native.tps:.2f}")
    if args.glibc:
        print(f"nki_moe / nki_moe under tuned glibc malloc: tokens/s ratio {ours.tps / results['MoE nki_moe, glibc'].tps:.2f}")
    if args.baseline_checkout:
        base = results["MoE nki_moe, baseline"]
        print(f"nki_moe / baseline checkout ({args.baseline_checkout}): tokens/s ratio {ours.tps / base.tps:.2f} (target >= 2.00)")


def grid(args: argparse.Namespace) -> None:
    extra = [f"training.steps={args.steps}", *args.overrides]
    print(
        f"{'top_k':>5s} {'experts':>7s} {'native tok/s':>12s} {'nki_moe tok/s':>13s} {'native MFU':>10s} "
        f"{'nki_moe MFU':>11s} {'speed-up':>8s}  kernel"
    )
    for top_k, experts in itertools.product(args.top_k, args.experts):
        shape = (f"model.top_k={top_k}", f"model.num_experts={experts}")
        specs = [RunSpec(f"{backend}", (f"backend={backend}", *MOE, *COMMON, *shape)) for backend in ("native", "nki_moe")]
        results = measure(specs, extra, args.pairs)
        native, ours = results["native"], results["nki_moe"]
        print(
            f"{top_k:5d} {experts:7d} {native.tps:12.0f} {ours.tps:13.0f} {native.mfu:9.2f}% {ours.mfu:10.2f}% "
            f"{ours.tps / native.tps:7.2f}x  {ours.kernel}",
            flush=True,
        )
    print(
        f"debugmodel_moe, {' '.join(COMMON + extra)}; medians over {args.pairs} alternating round(s), "
        f"load average {os.getloadavg()[0]:.2f} (shared machine)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=3, help="rounds (each runs every configuration once)")
    parser.add_argument("--steps", type=int, default=10, help="training steps per run (the first is not counted)")
    parser.add_argument(
        "--baseline-checkout", type=Path, default=None, help="another checkout of this project whose backend=nki_moe joins the rounds"
    )
    parser.add_argument("--glibc", action="store_true", help="add backend=nki_moe under tuned glibc malloc instead of tcmalloc")
    parser.add_argument("--grid", action="store_true", help="native vs nki_moe over top_k x num_experts")
    parser.add_argument("--top-k", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--experts", type=int, nargs="+", default=[16, 64, 128])
    parser.add_argument("overrides", nargs="*", help="extra key=value overrides for every run")
    args = parser.parse_args()
    if args.grid:
        grid(args)
    else:
        headline(args)


if __name__ == "__main__":
    main()
