"""The expert implementations inside one training run: torchtitan's ``GroupedExperts`` and every
project kernel, swapped between steps of one Trainer.

    python benchmarks/experts_in_training.py                       # debugmodel_moe, 2 layers
    python benchmarks/experts_in_training.py --steps 48 model.top_k=2

One process, one Trainer built as ``python -m qwen3_trn backend=nki_moe`` builds it. After the
warm-up steps, the steps rotate over the implementations (each MoE layer's experts switched
between steps), so all of them see the same weights, routing, data and machine state; what
separate runs would add (process start, allocator and page-cache state, a neighbour's load)
falls on all alike. The routing is the one training produces, not a random one. Prints each
implementation's median step time and its ratio to ``GroupedExperts``, with every step's figure,
and the routing of the last step (the busiest experts' row counts, per MoE layer). With
``--no-expert-math`` the rotation also has steps whose experts return zeros (outputs and weight
gradients): each implementation's median step minus theirs is its expert math's cost inside
training, beside what ``benchmarks/expert_layer_cost.py`` measures for it alone.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import types

import torch
from inprocess import single_rank_trainer_config
from torchtitan.models.common.moe import GroupedExperts

from qwen3_trn.common.local_tensors import local_tensor
from qwen3_trn.kernels import DEVICE_KERNELS, KERNELS, KernelGroupedExperts

DEFAULT_OVERRIDES = ["backend=nki_moe", "model=debugmodel_moe", "model.n_layers=2", "training.seq_len=256", "logger=none"]
BASELINE = "torchtitan GroupedExperts"
# The experts' outputs and weight gradients as zeros, at the cost of allocating them: the
# difference to the others' step time is what their expert math costs inside a training step.
NO_EXPERT_MATH = "no expert math (zeros)"
WARMUP = 4


class _Zeros(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w1, w2, w3):
        ctx.shapes = x, w1, w2, w3
        return x.new_zeros(x.shape)

    @staticmethod
    def backward(ctx, grad_out):
        return tuple(torch.zeros_like(t) for t in ctx.shapes)


def _zeros_forward(module: KernelGroupedExperts, x: torch.Tensor, _num_tokens_per_expert: torch.Tensor) -> torch.Tensor:
    weights = (local_tensor(w) for w in (module.w1_EFD, module.w2_EDF, module.w3_EFD))
    return _Zeros.apply(x, *weights)


def _use(module: KernelGroupedExperts, implementation: str) -> None:
    if implementation == BASELINE:
        module.forward = types.MethodType(GroupedExperts.forward, module)
    elif implementation == NO_EXPERT_MATH:
        module.forward = types.MethodType(_zeros_forward, module)
    else:
        module.__dict__.pop("forward", None)
        module.kernel = implementation


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40, help="measured steps, rotating over the implementations")
    parser.add_argument(
        "--no-expert-math", action="store_true", help=f"also rotate in {NO_EXPERT_MATH!r}: the expert math's cost in a step"
    )
    parser.add_argument("overrides", nargs="*", default=DEFAULT_OVERRIDES)
    args = parser.parse_args()
    portable = sorted(name for name in DEVICE_KERNELS["cpu"] if KERNELS[name].portable)
    implementations = [BASELINE, *portable, *([NO_EXPERT_MATH] if args.no_expert_math else [])]
    times: dict[str, list[float]] = {name: [] for name in implementations}
    with tempfile.TemporaryDirectory() as out_dir:
        _, config = single_rank_trainer_config([*args.overrides, f"training.steps={args.steps + WARMUP + 1}"], out_dir)
        trainer = config.build()
        try:
            experts = [m for m in trainer.model_parts[0].modules() if isinstance(m, KernelGroupedExperts)]
            routed: dict[int, list[int]] = {}
            for layer, module in enumerate(experts):
                module.register_forward_pre_hook(lambda _m, args, layer=layer: routed.__setitem__(layer, args[1].tolist()))
            data = trainer.batch_generator(trainer.dataloader)
            for index in range(WARMUP + args.steps):
                name = implementations[index % len(implementations)]
                for module in experts:
                    _use(module, name)
                start = time.perf_counter()
                trainer.step += 1
                trainer.train_step(data)
                if index >= WARMUP:
                    times[name].append(time.perf_counter() - start)
        finally:
            trainer.close()
    print(f"{' '.join(args.overrides)}; {args.steps} steps rotating after {WARMUP} warm-up steps")
    baseline = statistics.median(times[BASELINE])
    for name, values in times.items():
        median = statistics.median(values)
        figures = ", ".join(f"{1e3 * v:.0f}" for v in values)
        print(f"{name:26s} median {1e3 * median:6.0f} ms  {baseline / median:5.2f}x  [{figures}]")
    if args.no_expert_math:
        without = statistics.median(times[NO_EXPERT_MATH])
        costs = ", ".join(
            f"{name} {1e3 * (statistics.median(times[name]) - without):.0f} ms" for name in implementations if name != NO_EXPERT_MATH
        )
        print(f"expert math in a training step (median step minus the step without it): {costs}")
    for layer, counts in routed.items():
        busiest = sorted(counts, reverse=True)
        print(
            f"MoE layer {layer}, last step: {sum(counts)} routed rows over {len(counts)} experts, "
            f"{sum(1 for c in counts if c == 0)} empty; the busiest hold {busiest[:10]}"
        )


if __name__ == "__main__":
    main()
