"""Benchmark one MoE layer's expert computation: portable kernels vs torchtitan's GroupedExperts.

Times forward + backward of ``GroupedExperts`` (torchtitan, ``torch._grouped_mm`` in bf16) and of
``KernelGroupedExperts`` with each portable kernel, for parameters/inputs in bf16 and fp32, on
routed rows sorted by expert from a random top-k router. Prints ms, GFLOP/s and the fraction
of the matmul peak measured here with a large ``torch.mm``.

    python benchmarks/moe_kernels.py                 # both shapes, all kernels
    python benchmarks/moe_kernels.py --shapes debugmodel_moe --threads 1
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from torchtitan.models.common.moe import GroupedExperts  # noqa: E402

from qwen3_trn.kernels import KERNELS, MOE_SWIGLU_EXPERTS, KernelGroupedExperts  # noqa: E402
from qwen3_trn.kernels.moe import matmul_dtype  # noqa: E402


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
    # torchtitan qwen3 debugmodel_moe: dim 256, moe hidden 768, 64 experts, top 8; 512 tokens.
    "debugmodel_moe": MoEShape("debugmodel_moe", tokens=512, top_k=8, num_experts=64, dim=256, hidden_dim=768),
    "wide": MoEShape("wide", tokens=1024, top_k=4, num_experts=32, dim=512, hidden_dim=1024),
}


def timed(fn: Callable[[], None], repeats: int, max_seconds: float) -> float:
    """Median seconds per call after one warm-up call; stops early past ``max_seconds``."""
    fn()
    samples: list[float] = []
    start = time.perf_counter()
    while len(samples) < repeats and (not samples or time.perf_counter() - start < max_seconds):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return sorted(samples)[len(samples) // 2]


def matmul_peak(dtype: torch.dtype) -> float:
    """GFLOP/s of a large square ``torch.mm``; the size shrinks where a dtype is very slow here."""
    for size in (2048, 1024, 512):
        a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
        t0 = time.perf_counter()
        torch.mm(a, b)
        if time.perf_counter() - t0 < 1.0 or size == 512:
            seconds = timed(lambda: torch.mm(a, b), repeats=3, max_seconds=5.0)
            return 2 * size**3 / seconds / 1e9
    raise AssertionError("unreachable")


def routed_inputs(shape: MoEShape, dtype: torch.dtype, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    scores = torch.rand(shape.tokens, shape.num_experts, generator=generator)
    expert_ids = scores.topk(shape.top_k, dim=-1).indices.flatten()
    counts = torch.bincount(expert_ids, minlength=shape.num_experts)
    x = torch.randn(shape.rows, shape.dim, generator=generator, dtype=dtype)
    return x, counts


def build_experts(shape: MoEShape, dtype: torch.dtype, kernel: str | None) -> GroupedExperts:
    common = dict(dim=shape.dim, hidden_dim=shape.hidden_dim, num_experts=shape.num_experts)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"], choices=["bfloat16", "float32"])
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-seconds", type=float, default=20.0, help="time budget per case after warm-up")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    device_type = "cpu"
    portable = sorted(
        name for name, impl in KERNELS.impls(MOE_SWIGLU_EXPERTS.name).items() if impl.portable and device_type in impl.devices
    )
    peaks = {dtype: matmul_peak(dtype) for dtype in (torch.bfloat16, torch.float32)}
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, load average {os.getloadavg()[0]:.2f}")
    print(f"matmul peak (torch.mm): bf16 {peaks[torch.bfloat16]:.1f} GFLOP/s, fp32 {peaks[torch.float32]:.1f} GFLOP/s")
    print(f"auto on {device_type}: {KERNELS.select_kernel(MOE_SWIGLU_EXPERTS.name, 'auto', device_type).impl_name}")
    header = (
        f"{'shape':15s} {'params':8s} {'kernel':22s} {'matmul':8s} {'ms':>9s} {'GFLOP/s':>8s} "
        f"{'%bf16pk':>8s} {'%fp32pk':>8s} {'speedup':>8s}"
    )
    print(header)
    print("-" * len(header))
    for shape_name in args.shapes:
        shape = SHAPES[shape_name]
        for dtype_name in args.dtypes:
            dtype = getattr(torch, dtype_name)
            x, counts = routed_inputs(shape, dtype)
            baseline_ms = None
            for kernel in [None, *portable]:
                module = build_experts(shape, dtype, kernel)
                seconds = timed(fwd_bwd(module, x, counts), args.repeats, args.max_seconds)
                ms = seconds * 1e3
                gflops = shape.flops_fwd_bwd / seconds / 1e9
                if kernel is None:
                    baseline_ms, label, matmul = ms, "torchtitan GroupedExp.", "bf16"
                else:
                    label = kernel
                    mm_dtype = matmul_dtype(torch.empty(0, dtype=torch.bfloat16)) if kernel == "per_expert_mm" else torch.bfloat16
                    matmul = "fp32" if mm_dtype == torch.float32 else "bf16"
                print(
                    f"{shape.name:15s} {dtype_name[:8]:8s} {label:22s} {matmul:8s} {ms:9.1f} {gflops:8.1f} "
                    f"{100 * gflops / peaks[torch.bfloat16]:7.1f}% {100 * gflops / peaks[torch.float32]:7.1f}% "
                    f"{baseline_ms / ms:7.2f}x"
                )
    shapes = ", ".join(f"{s.name}: R={s.rows} E={s.num_experts} D={s.dim} F={s.hidden_dim}" for s in map(SHAPES.get, args.shapes))
    print(f"\nFLOPs per fwd+bwd = 18*R*D*F, R = tokens*top_k routed rows ({shapes}).")


if __name__ == "__main__":
    main()
