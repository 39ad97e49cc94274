"""Benchmark one MoE layer's expert MLP, forward + backward: every kernel against torchtitan's
``GroupedExperts``, in the dtype training uses on this machine and in the other one separately.

``GroupedExperts`` (torchtitan) always casts to bf16 and runs ``torch._grouped_mm``;
``KernelGroupedExperts`` runs each portable kernel in the dtype of its inputs. Inputs are routed
rows sorted by expert from a random top-k router (some shapes leave experts empty). Cases are
timed round-robin (one call of each per round, ``--rounds`` rounds, medians), so a shared
machine's load falls on all of them alike. Printed per case: ms, GFLOP/s, the fraction of this
dtype's matmul peak (a large ``torch.mm``, measured in the same run, also round-robin) and the
speed-up over ``GroupedExperts`` with the same parameters.

    python benchmarks/moe_kernels.py                          # all shapes, both dtypes
    python benchmarks/moe_kernels.py --shapes debugmodel_moe --dtypes float32
    python benchmarks/moe_kernels.py --costs      # padded_bmm's cost constants, measured here

``--costs`` measures, on the debugmodel_moe expert shape in the training dtype, the two fixed
costs ``padded_bmm`` weighs when it picks its capacity, in rows of compute: a per-expert matmul's
launch (the intercept of ``torch.mm`` time against rows) and the batched pass's cost per expert
(the intercept of ``torch.bmm`` time against the capacity, over all experts). The calls are timed
round-robin, so each finds the caches holding the others' data, as in a training step.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from inprocess import REPO  # noqa: F401  (puts the checkout's qwen3_trn first on sys.path)
from torchtitan.models.common.moe import GroupedExperts

from qwen3_trn.devices import resolve_device
from qwen3_trn.kernels import DEVICE_KERNELS, KERNELS, KernelGroupedExperts
from qwen3_trn.kernels.moe import matmul_dtype
from qwen3_trn.kernels.moe_padded import BATCHED_PASS_ROWS, GROUP_LAUNCH_ROWS


@dataclass(frozen=True)
class MoEShape:
    name: str
    tokens: int
    top_k: int
    num_experts: int
    dim: int
    hidden_dim: int

    @property
    def rows(self) -> int:
        return self.tokens * self.top_k

    @property
    def flops_fwd_bwd(self) -> int:
        # 3 projections of 2*R*D*F flops forward, twice that backward (input and weight grads).
        return 3 * 3 * 2 * self.rows * self.dim * self.hidden_dim


SHAPES = {
    # torchtitan qwen3 debugmodel_moe at the default batch (2 x 256 tokens): 64 rows per expert.
    "debugmodel_moe": MoEShape("debugmodel_moe", tokens=512, top_k=8, num_experts=64, dim=256, hidden_dim=768),
    # the same layer at top-1 and 128 experts: 4 rows per expert, many experts empty.
    "sparse": MoEShape("sparse", tokens=512, top_k=1, num_experts=128, dim=256, hidden_dim=768),
    "wide": MoEShape("wide", tokens=1024, top_k=4, num_experts=32, dim=512, hidden_dim=1024),
}
BASELINE = "torchtitan GroupedExperts"


def training_dtype() -> torch.dtype:
    """What ``python -m qwen3_trn`` trains in on this CPU by default (mixed_precision_param=auto)."""
    return torch.bfloat16 if resolve_device("cpu").fast_bf16 else torch.float32


def round_robin(cases: dict[str, Callable[[], None]], rounds: int, max_seconds: float) -> dict[str, float]:
    """Median seconds per call of each case; one warm-up call each, then rounds of one call each."""
    for fn in cases.values():
        fn()
    samples: dict[str, list[float]] = {name: [] for name in cases}
    start = time.perf_counter()
    for round_ in range(rounds):
        if round_ >= 3 and time.perf_counter() - start > max_seconds:
            break
        for name, fn in cases.items():
            t0 = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - t0)
    return {name: statistics.median(times) for name, times in samples.items()}


def matmul_cases(dtypes: list[torch.dtype], size: int = 1024) -> dict[str, Callable[[], None]]:
    cases = {}
    for dtype in dtypes:
        a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
        cases[str(dtype)] = lambda a=a, b=b: torch.mm(a, b)
    return cases


def routed_inputs(shape: MoEShape, dtype: torch.dtype, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    scores = torch.rand(shape.tokens, shape.num_experts, generator=generator)
    expert_ids = scores.topk(shape.top_k, dim=-1).indices.flatten()
    counts = torch.bincount(expert_ids, minlength=shape.num_experts)
    x = torch.randn(shape.rows, shape.dim, generator=generator, dtype=dtype)
    return x, counts


def build_experts(shape: MoEShape, dtype: torch.dtype, kernel: str | None) -> GroupedExperts:
    common = {"dim": shape.dim, "hidden_dim": shape.hidden_dim, "num_experts": shape.num_experts}
    config = GroupedExperts.Config(**common) if kernel is None else KernelGroupedExperts.Config(**common, kernel=kernel)
    module = config.build().to(dtype)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in module.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * 0.02)
    return module


def fwd_bwd(module: GroupedExperts, x: torch.Tensor, counts: torch.Tensor) -> Callable[[], None]:
    grad = torch.randn_like(x)

    def step() -> None:
        module.zero_grad(set_to_none=True)
        x_ = x.detach().requires_grad_()
        module(x_, counts).backward(grad)

    return step


def fixed_costs(shape: MoEShape, dtype: torch.dtype, rounds: int) -> None:
    """Print the per-expert launch and batched-pass costs in rows (see ``--costs``)."""
    experts, dim, hidden = shape.num_experts, shape.dim, shape.hidden_dim
    weights = torch.randn(experts, hidden, dim, dtype=dtype)
    few, many = 64, 512  # per-expert matmuls run the groups above the capacity: the larger ones
    rows = {n: torch.randn(n, dim, dtype=dtype) for n in (few, many)}
    padded = {c: torch.randn(experts, c, dim, dtype=dtype) for c in (1, 64)}
    cases = {
        **{f"mm {n}": (lambda n=n: torch.mm(rows[n], weights[0].t())) for n in rows},
        **{f"bmm {c}": (lambda c=c: torch.bmm(padded[c], weights.transpose(1, 2))) for c in padded},
    }
    seconds = round_robin(cases, rounds=max(rounds, 30), max_seconds=30.0)
    per_row = (seconds[f"mm {many}"] - seconds[f"mm {few}"]) / (many - few)
    launch = seconds[f"mm {few}"] - few * per_row
    per_padded_row = (seconds["bmm 64"] - seconds["bmm 1"]) / (experts * 63)
    batched = seconds["bmm 1"] - experts * per_padded_row
    print(
        f"{shape.name} expert ({dim} x {hidden}), {_dtype_name(dtype)}: one row {per_row * 1e6:.2f} us in torch.mm, {per_padded_row * 1e6:.2f} us in torch.bmm"
    )
    print(f"per-expert matmul launch: {launch / per_row:6.0f} rows  (GROUP_LAUNCH_ROWS = {GROUP_LAUNCH_ROWS})")
    print(f"batched pass, per expert: {batched / experts / per_row:6.0f} rows  (BATCHED_PASS_ROWS = {BATCHED_PASS_ROWS})")


def _dtype_name(dtype: torch.dtype) -> str:
    return {torch.float32: "fp32", torch.bfloat16: "bf16"}[dtype]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument(
        "--dtypes", nargs="+", default=None, choices=["bfloat16", "float32"], help="default: the training dtype here first, then the other"
    )
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--max-seconds", type=float, default=60.0, help="time budget per shape and dtype")
    parser.add_argument("--costs", action="store_true", help="measure padded_bmm's fixed costs instead")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.costs:
        fixed_costs(SHAPES["debugmodel_moe"], training_dtype(), args.rounds)
        return

    trained = training_dtype()
    dtypes = (
        [getattr(torch, name) for name in args.dtypes]
        if args.dtypes
        else [trained, *(d for d in (torch.float32, torch.bfloat16) if d != trained)]
    )
    kernels = sorted(name for name in DEVICE_KERNELS["cpu"] if KERNELS[name].portable)
    peak_seconds = round_robin(matmul_cases(dtypes), rounds=5, max_seconds=10.0)
    peaks = {d: 2 * 1024**3 / peak_seconds[str(d)] / 1e9 for d in dtypes}
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, load average {os.getloadavg()[0]:.2f} "
        "(the machine may be shared: cases are timed round-robin, medians)"
    )
    print(f"training dtype on this CPU: {_dtype_name(trained)} (native bf16 matmul: {trained == torch.bfloat16})")
    print("matmul peak (torch.mm 1024^3): " + ", ".join(f"{_dtype_name(d)} {peaks[d]:.1f} GFLOP/s" for d in dtypes))
    header = f"{'shape':15s} {'params':6s} {'kernel':26s} {'matmul':6s} {'ms':>8s} {'GFLOP/s':>8s} {'% peak':>7s} {'speed-up':>8s}"
    print(header)
    print("-" * len(header))
    for shape_name in args.shapes:
        shape = SHAPES[shape_name]
        for dtype in dtypes:
            x, counts = routed_inputs(shape, dtype)
            labels = {BASELINE: None, **{kernel: kernel for kernel in kernels}}
            cases = {label: fwd_bwd(build_experts(shape, dtype, kernel), x, counts) for label, kernel in labels.items()}
            seconds = round_robin(cases, args.rounds, args.max_seconds)
            for label, kernel in labels.items():
                matmul = torch.bfloat16 if kernel is None else matmul_dtype(x)
                gflops = shape.flops_fwd_bwd / seconds[label] / 1e9
                peak = peaks.get(matmul)
                share = f"{100 * gflops / peak:6.1f}%" if peak else f"{'-':>7s}"
                print(
                    f"{shape.name:15s} {_dtype_name(dtype):6s} {label:26s} {_dtype_name(matmul):6s} "
                    f"{seconds[label] * 1e3:8.1f} {gflops:8.1f} {share} {seconds[BASELINE] / seconds[label]:7.2f}x"
                )
    print()
    for shape in map(SHAPES.get, args.shapes):
        empty = int((routed_inputs(shape, torch.float32)[1] == 0).sum())
        print(
            f"{shape.name}: R={shape.rows} routed rows, E={shape.num_experts} ({empty} empty), "
            f"D={shape.dim}, F={shape.hidden_dim}, {shape.rows / shape.num_experts:.0f} rows per expert on average"
        )
    print("FLOPs per fwd+bwd = 18*R*D*F. '% peak' is against the peak of the dtype the matmuls run in.")


if __name__ == "__main__":
    main()
