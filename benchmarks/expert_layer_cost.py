"""Where the expert layer's time goes: the expert operator against its own matmuls, at the
routing training produces, beside the dense feed-forward's matmuls.

    python benchmarks/expert_layer_cost.py
    python benchmarks/expert_layer_cost.py --rounds 30 model.top_k=2

Trains ``--train-steps`` steps in one process exactly as ``python -m qwen3_trn backend=nki_moe``
does (``benchmarks/inprocess.py``) and keeps what each MoE layer's experts received in the last
step: the routed rows, the per-expert row counts and the weights in the dtype the matmuls run
in. Then, in the same process, round by round in turn (each round starting one piece further
on; medians over the rounds), forward + backward of every MoE layer through:

* the expert operator with the kernel training resolved, once more after the caches were evicted
  (as the rest of a training step evicts them), and torchtitan's ``GroupedExperts``;
* the operator's matmuls alone (``torch._grouped_mm``, as the kernel calls them), and the same
  matmuls as one ``torch.mm`` per expert, by kind: forward, input gradients, weight gradients;
* the SwiGLU and its gradient over all rows;
* references with the same FLOPs per kind: every routed row through one expert's weights (one
  large matmul per projection), and the dense debugmodel's feed-forward shape (tokens x dim x
  its hidden width).

The routing repeats round after round, so oneDNN (torch's CPU bf16 matmuls) compiles its kernel
for each shape once, in the warm-up. Inside training the group sizes change every step: what
new shapes cost there is measured by ``benchmarks/grouped_mm_in_training.py`` (with
``--exact-groups``, without ``grouped_mm``'s ``ONEDNN_TOKEN_ALIGNMENT`` padding).

Prints milliseconds per training step (all MoE layers), GFLOP/s, and what part of the
operator's time each piece explains: how much of the expert layer is matmuls at the shapes the
routing makes, and what those matmuls would take at the dense feed-forward's rate.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from inprocess import single_rank_trainer_config
from torchtitan.models.common.feed_forward import FeedForward
from torchtitan.models.common.moe import GroupedExperts
from torchtitan.models.qwen3 import model_registry

from qwen3_trn.common.local_tensors import local_tensor
from qwen3_trn.kernels import ExpertKernel, KernelGroupedExperts, select_kernel
from qwen3_trn.kernels.moe import grouped_mm_token_groups, moe_problem, swiglu, swiglu_backward

DEFAULT_OVERRIDES = ["backend=nki_moe", "model=debugmodel_moe", "model.n_layers=2", "training.seq_len=256", "logger=none"]
DENSE_FLAVOR = "debugmodel"
# The operator once more, after a pass over a buffer several times the last-level cache: in a
# training step the other layers' weights and activations pass through the caches in between.
COLD = "expert operator, caches evicted first"
EVICTION_BYTES = 256 * 2**20


@dataclass
class ExpertInputs:
    """One MoE layer's expert inputs in the last training step."""

    x: torch.Tensor  # [R, D], rows sorted by expert
    counts: torch.Tensor  # [E]
    w1: torch.Tensor  # [E, F, D]
    w2: torch.Tensor  # [E, D, F]
    w3: torch.Tensor  # [E, F, D]
    kernel: ExpertKernel  # what training resolved for this layer

    @property
    def ranges(self) -> list[tuple[int, int, int]]:
        bounds = torch.cumsum(self.counts, 0).tolist()
        return [(e, end - n, end) for e, (n, end) in enumerate(zip(self.counts.tolist(), bounds, strict=True)) if n]


def capture_expert_inputs(overrides: list[str], out_dir: str, steps: int) -> tuple[list[ExpertInputs], int]:
    """Train ``steps`` steps; every MoE layer's expert inputs of the last, and the tokens a step."""
    cfg, config = single_rank_trainer_config([*overrides, f"training.steps={steps + 1}"], out_dir)
    trainer = config.build()
    captured: dict[int, ExpertInputs] = {}
    try:
        experts = [m for m in trainer.model_parts[0].modules() if isinstance(m, KernelGroupedExperts)]
        if not experts:
            raise SystemExit("no kernel experts in this model: run it with backend=nki_moe and a MoE model")

        def keep(layer: int, module: KernelGroupedExperts, args: tuple) -> None:
            x, counts = args
            weights = [local_tensor(w) for w in (module.w1_EFD, module.w2_EDF, module.w3_EFD)]
            problem = moe_problem(dim=x.shape[1], hidden_dim=weights[0].shape[1], num_experts=weights[0].shape[0])
            kernel = select_kernel(module.kernel, x.device.type, problem)
            w1, w2, w3 = (w.detach().to(x.dtype).clone() for w in weights)
            captured[layer] = ExpertInputs(x.detach().clone(), counts.detach().clone(), w1, w2, w3, kernel)

        for layer, module in enumerate(experts):
            module.register_forward_pre_hook(lambda m, args, layer=layer: keep(layer, m, args))
        data = trainer.batch_generator(trainer.dataloader)
        for _ in range(steps):
            trainer.step += 1
            trainer.train_step(data)
    finally:
        trainer.close()
    return [captured[layer] for layer in sorted(captured)], cfg.training.local_batch_size * cfg.training.seq_len


def dense_hidden_dim(flavor: str) -> int:
    (_fqn, ffn, _parent, _attr), *_ = model_registry(flavor).model.traverse(FeedForward.Config)
    return ffn.w1.out_features


# --------------------------------------------------------------------------- the timed pieces
def _operator(layers: list[ExpertInputs]) -> Callable[[], None]:
    ops = [e.kernel.op for e in layers]
    leaves = [[t.clone().requires_grad_() for t in (e.x, e.w1, e.w2, e.w3)] for e in layers]

    def run() -> None:
        for op, e, (x, w1, w2, w3) in zip(ops, layers, leaves, strict=True):
            out = op(x, w1, w2, w3, e.counts)[0]
            torch.autograd.grad(out, (x, w1, w2, w3), torch.ones_like(out))

    return run


def _grouped_experts(layers: list[ExpertInputs]) -> Callable[[], None]:
    modules = []
    for e in layers:
        experts, hidden, dim = e.w1.shape
        module = GroupedExperts.Config(dim=dim, hidden_dim=hidden, num_experts=experts).build().to(e.x.dtype)
        with torch.no_grad():
            module.w1_EFD.copy_(e.w1), module.w2_EDF.copy_(e.w2), module.w3_EFD.copy_(e.w3)
        modules.append((module, e.x.clone().requires_grad_()))

    def run() -> None:
        for (module, x), e in zip(modules, layers, strict=True):
            out = module(x, e.counts)
            torch.autograd.grad(out, (x, *module.parameters()), torch.ones_like(out))

    return run


def _grouped_matmuls(layers: list[ExpertInputs]) -> Callable[[], None]:
    """The nine ``torch._grouped_mm`` calls of the grouped_mm kernel's forward and backward, on
    the groups it runs (padded where the device or oneDNN needs it)."""
    state = []
    for e in layers:
        groups = grouped_mm_token_groups(e.x, e.counts)
        x = groups.pad(e.x)
        rows, hidden = x.shape[0], e.w1.shape[1]
        h, g = torch.randn(rows, hidden, dtype=x.dtype), torch.randn(rows, x.shape[1], dtype=x.dtype)
        state.append((e, x, groups.offsets, h, g))

    def run() -> None:
        for e, x, offs, h, g in state:
            torch._grouped_mm(x, e.w1.transpose(-2, -1), offs=offs)
            torch._grouped_mm(x, e.w3.transpose(-2, -1), offs=offs)
            torch._grouped_mm(h, e.w2.transpose(-2, -1), offs=offs)
            torch._grouped_mm(g, e.w2, offs=offs)
            torch._grouped_mm(h, e.w1, offs=offs)
            torch._grouped_mm(h, e.w3, offs=offs)
            torch._grouped_mm(h.t(), x, offs=offs)
            torch._grouped_mm(h.t(), x, offs=offs)
            torch._grouped_mm(g.t(), h, offs=offs)

    return run


MATMUL_KINDS = ("forward", "input gradients", "weight gradients")


def _matmuls(kind: str, problems: list[tuple[list[tuple[int, int]], torch.Tensor, torch.Tensor, torch.Tensor]]) -> Callable[[], None]:
    """Three matmuls of ``kind`` per (row range, weight) of each problem, into preallocated outputs.

    A problem is ``(ranges, w13 [E, F, D], w2 [E, D, F], rows [R, D])``: ranges ``(expert, rows)``.
    """
    prepared = []
    for ranges, w13, w2, x in problems:
        rows, hidden, dim = x.shape[0], w13.shape[1], x.shape[1]
        h, g = torch.randn(rows, hidden, dtype=x.dtype), torch.randn(rows, dim, dtype=x.dtype)
        out_h, out_d, out_w13, out_w2 = torch.empty_like(h), torch.empty_like(g), torch.empty_like(w13), torch.empty_like(w2)
        prepared.append((ranges, w13, w2, x, h, g, out_h, out_d, out_w13, out_w2))

    def run() -> None:
        for ranges, w13, w2, x, h, g, out_h, out_d, out_w13, out_w2 in prepared:
            for expert, (start, end) in ranges:
                rows = slice(start, end)
                if kind == "forward":
                    torch.mm(x[rows], w13[expert].t(), out=out_h[rows])
                    torch.mm(x[rows], w13[expert].t(), out=out_h[rows])
                    torch.mm(h[rows], w2[expert].t(), out=out_d[rows])
                elif kind == "input gradients":
                    torch.mm(g[rows], w2[expert], out=out_h[rows])
                    torch.mm(h[rows], w13[expert], out=out_d[rows])
                    torch.mm(h[rows], w13[expert], out=out_d[rows])
                else:
                    torch.mm(h[rows].t(), x[rows], out=out_w13[expert])
                    torch.mm(h[rows].t(), x[rows], out=out_w13[expert])
                    torch.mm(g[rows].t(), h[rows], out=out_w2[expert])

    return run


def _swiglu(layers: list[ExpertInputs]) -> Callable[[], None]:
    tensors = [tuple(torch.randn(e.x.shape[0], e.w1.shape[1], dtype=e.x.dtype) for _ in range(3)) for e in layers]

    def run() -> None:
        for gate, up, grad_h in tensors:
            swiglu(gate, up)
            swiglu_backward(grad_h.clone(), gate, up)

    return run


def matmul_gflop(rows: int, dim: int, hidden: int) -> float:
    """Nine matmuls (three projections: forward, input and weight gradients) over ``rows``."""
    return 9 * 2 * rows * dim * hidden / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=20, help="timed rounds; every piece runs once a round, in turn")
    parser.add_argument(
        "--train-steps", type=int, default=50, help="training steps before the routing is kept (it changes as training goes)"
    )
    parser.add_argument("overrides", nargs="*", default=DEFAULT_OVERRIDES)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as out_dir:
        layers, tokens = capture_expert_inputs(args.overrides, out_dir, args.train_steps)
    dtype = layers[0].x.dtype
    experts, hidden, dim = layers[0].w1.shape
    dense_hidden = dense_hidden_dim(DENSE_FLAVOR)
    expert_gflop = sum(matmul_gflop(e.x.shape[0], dim, hidden) for e in layers)

    per_expert = [([(i, (s, t)) for i, s, t in e.ranges], e.w1, e.w2, e.x) for e in layers]
    stacked = [([(0, (0, e.x.shape[0]))], e.w1[:1], e.w2[:1], e.x) for e in layers]
    dense_rows = torch.randn(tokens, dim, dtype=dtype)
    dense = [
        ([(0, (0, tokens))], torch.randn(1, dense_hidden, dim, dtype=dtype), torch.randn(1, dim, dense_hidden, dtype=dtype), dense_rows)
    ]
    # The dense layer's work is scaled to the experts' FLOPs by its rate, so one layer is enough.
    operator_name = f"expert operator ({layers[0].kernel.name})"
    pieces: dict[str, tuple[Callable[[], None], float]] = {
        operator_name: (_operator(layers), expert_gflop),
        COLD: (_operator(layers), expert_gflop),
        "torchtitan GroupedExperts": (_grouped_experts(layers), expert_gflop),
        "its matmuls (torch._grouped_mm)": (_grouped_matmuls(layers), expert_gflop),
        "SwiGLU and its gradient": (_swiglu(layers), 0.0),
    }
    for kind in MATMUL_KINDS:
        third = expert_gflop / 3
        pieces[f"per expert: {kind}"] = (_matmuls(kind, per_expert), third)
        pieces[f"one weight, all rows: {kind}"] = (_matmuls(kind, stacked), third)
        pieces[f"dense FFN shape: {kind}"] = (_matmuls(kind, dense), matmul_gflop(tokens, dim, dense_hidden) / 3)

    times: dict[str, list[float]] = {name: [] for name in pieces}
    for run, _ in pieces.values():  # warm-up
        run()
    evict = torch.empty(EVICTION_BYTES // 4)
    names = list(pieces)
    for round_index in range(args.rounds):
        # Each round starts one piece further on, so that no piece always follows the same one.
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            run = pieces[name][0]
            if name == COLD:
                evict.add_(1.0)
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    ms = {name: 1e3 * statistics.median(values) for name, values in times.items()}
    rate = {name: pieces[name][1] / (ms[name] / 1e3) for name in pieces if pieces[name][1]}

    print(
        f"{' '.join(args.overrides)}: routing of training step {args.train_steps}, {dtype}, {torch.get_num_threads()} threads, {args.rounds} rounds (medians)"
    )
    for layer, e in enumerate(layers):
        counts = e.counts.tolist()
        print(
            f"MoE layer {layer}: {sum(counts)} routed rows over {experts} experts ({sum(1 for c in counts if c == 0)} empty, "
            f"mean {sum(counts) / max(1, sum(1 for c in counts if c)):.0f} rows a non-empty one, busiest {max(counts)}); "
            f"x [R, {dim}] @ [{dim}, {hidden}]"
        )
    print(f"dense FFN shape: [{tokens}, {dim}] @ [{dim}, {dense_hidden}] (the {DENSE_FLAVOR} flavor's feed-forward)\n")
    print(f"{'forward + backward, all MoE layers':44s} {'ms/step':>8s} {'GFLOP/s':>8s}")
    for name in pieces:
        print(f"{name:44s} {ms[name]:8.1f} {rate.get(name, float('nan')):8.1f}")

    operator = ms[operator_name]
    grouped = ms["its matmuls (torch._grouped_mm)"]
    loop = sum(ms[f"per expert: {kind}"] for kind in MATMUL_KINDS)
    at_dense = sum(pieces[f"per expert: {kind}"][1] / rate[f"dense FFN shape: {kind}"] * 1e3 for kind in MATMUL_KINDS)
    print(
        f"\nexpert operator {operator:.1f} ms: its grouped matmuls {grouped:.1f} ms ({100 * grouped / operator:.0f} %), "
        f"SwiGLU {ms['SwiGLU and its gradient']:.1f} ms ({100 * ms['SwiGLU and its gradient'] / operator:.0f} %), "
        f"the rest {operator - grouped - ms['SwiGLU and its gradient']:.1f} ms"
    )
    print(
        f"the same matmuls one torch.mm per expert: {loop:.1f} ms; at the dense FFN shape's rate per kind they would take "
        f"{at_dense:.1f} ms ({operator - grouped + at_dense:.1f} ms for the operator, {operator / (operator - grouped + at_dense):.2f}x faster)"
    )


if __name__ == "__main__":
    main()
