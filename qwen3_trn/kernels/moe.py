"""The MoE expert operator: grouped SwiGLU projections over rows sorted by expert.

``moe_swiglu_experts(x [R, D], w1 [E, F, D], w2 [E, D, F], w3 [E, F, D], num_tokens_per_expert [E])``
computes, for the rows of each expert e, ``(silu(x @ w1[e].T) * (x @ w3[e].T)) @ w2[e].T`` —
torchtitan's ``GroupedExperts`` math. Rows must be sorted by expert and ``R`` must equal
``num_tokens_per_expert.sum()`` (padding rows, if a dispatcher adds them, are counted in).
Experts with no rows are skipped; their weight gradients are zero.

Each implementation returns ``(out [R, D], gate [R, F], up [R, F])``: the pre-activation
projections are saved for backward (marked non-differentiable) so no implementation recomputes
them; the autograd formula calls the backward operator of the *same* implementation.

Portable implementations:

* ``grouped_mm``: ``torch._grouped_mm`` in the input dtype, as torchtitan does. On devices that
  need aligned group offsets (Neuron: 128 rows) each expert's group is padded in a static
  buffer first. Best on CUDA; the only portable one on Neuron.
* ``per_expert_mm``: one dense matmul per non-empty expert on contiguous row slices. On CPUs
  without native bf16 matmul (no AVX512-BF16/AMX) each slice is upcast to fp32 for the matmul,
  which is what bf16 tensor cores do too (bf16 operands, fp32 accumulation); outputs are
  stored in the input dtype. Needs the counts on the host (one sync). Best on CPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F

from .layouts import (
    blockwise_routing,
    hidden_with_padding_row,
    padded_group_sizes,
    rows_from_blocks,
)
from .registry import KernelChoice, OpDeclaration, declare_op, register_kernel, resolve_op

__all__ = [
    "GROUPED_MM_TOKEN_ALIGNMENT",
    "MOE_SWIGLU_EXPERTS",
    "MOE_SWIGLU_EXPERTS_BACKWARD",
    "matmul_dtype",
    "moe_problem",
    "moe_swiglu_experts",
]

# Devices whose grouped matmul needs every group offset to be a multiple of this many rows.
GROUPED_MM_TOKEN_ALIGNMENT: dict[str, int] = {"neuron": 128}


# --------------------------------------------------------------------------- declaration
def _fake_forward(x, w1, w2, w3, num_tokens_per_expert):
    rows, hidden = x.shape[0], w1.shape[1]
    return x.new_empty(rows, w2.shape[1]), x.new_empty(rows, hidden), x.new_empty(rows, hidden)


def _fake_backward(grad_out, x, w1, w2, w3, num_tokens_per_expert, gate, up, out):
    return torch.empty_like(x), torch.empty_like(w1), torch.empty_like(w2), torch.empty_like(w3)


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[Any, ...]) -> None:
    x, w1, w2, w3, num_tokens_per_expert = inputs
    out, gate, up = output
    ctx.mark_non_differentiable(gate, up)
    # `out` is kept for kernels that checkpoint the down projection (the NKI backward).
    ctx.save_for_backward(x, w1, w2, w3, num_tokens_per_expert, gate, up, out)


def _backward(ctx: Any, grad_out, _grad_gate, _grad_up, *, backward_kernel):
    x, w1, w2, w3, num_tokens_per_expert, gate, up, out = ctx.saved_tensors
    grad_x, grad_w1, grad_w2, grad_w3 = backward_kernel(grad_out.contiguous(), x, w1, w2, w3, num_tokens_per_expert, gate, up, out)
    return grad_x, grad_w1, grad_w2, grad_w3, None


MOE_SWIGLU_EXPERTS = declare_op(
    OpDeclaration(
        name="moe_swiglu_experts",
        schema="(Tensor x, Tensor w1, Tensor w2, Tensor w3, Tensor num_tokens_per_expert) -> (Tensor, Tensor, Tensor)",
        fake=_fake_forward,
        setup_context=_setup_context,
        backward=_backward,
        backward_op="moe_swiglu_experts_backward",
        doc="Grouped SwiGLU expert MLP over rows sorted by expert; returns (out, gate, up).",
    )
)
MOE_SWIGLU_EXPERTS_BACKWARD = declare_op(
    OpDeclaration(
        name="moe_swiglu_experts_backward",
        schema=(
            "(Tensor grad_out, Tensor x, Tensor w1, Tensor w2, Tensor w3, Tensor num_tokens_per_expert, "
            "Tensor gate, Tensor up, Tensor out) -> (Tensor, Tensor, Tensor, Tensor)"
        ),
        fake=_fake_backward,
        doc="Gradients (x, w1, w2, w3) of moe_swiglu_experts.",
    )
)


def moe_problem(*, dim: int, hidden_dim: int, num_experts: int) -> dict[str, int]:
    """The shape description kernels' shape checks receive."""
    return {"dim": dim, "hidden_dim": hidden_dim, "num_experts": num_experts}


def moe_swiglu_experts(
    x: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    w3: torch.Tensor,
    num_tokens_per_expert: torch.Tensor,
    *,
    kernel: str | KernelChoice = "auto",
) -> torch.Tensor:
    """Expert outputs ``[R, D]``; ``kernel`` is ``auto | portable | <impl>`` or a resolved choice."""
    _check_inputs(x, w1, w2, w3, num_tokens_per_expert)
    if isinstance(kernel, KernelChoice):
        op = kernel.op
    else:
        problem = moe_problem(dim=x.shape[1], hidden_dim=w1.shape[1], num_experts=w1.shape[0])
        op = resolve_op(MOE_SWIGLU_EXPERTS.name, kernel, x.device.type, problem)
    out, _gate, _up = op(x, w1, w2, w3, num_tokens_per_expert)
    return out


def _check_inputs(x, w1, w2, w3, num_tokens_per_expert) -> None:
    experts, hidden, dim = w1.shape
    if x.dim() != 2 or x.shape[1] != dim:
        raise ValueError(f"x must be [R, {dim}], got {tuple(x.shape)}")
    if tuple(w3.shape) != (experts, hidden, dim) or tuple(w2.shape) != (experts, dim, hidden):
        raise ValueError(f"expected w1/w3 [E, F, D] and w2 [E, D, F]; got {tuple(w1.shape)}, {tuple(w3.shape)}, {tuple(w2.shape)}")
    if not (x.dtype == w1.dtype == w2.dtype == w3.dtype):
        raise ValueError(f"x and weights must share a dtype, got {x.dtype}, {w1.dtype}, {w2.dtype}, {w3.dtype}")
    if num_tokens_per_expert.shape != (experts,) or num_tokens_per_expert.is_floating_point():
        raise ValueError(f"num_tokens_per_expert must be an integer tensor of shape ({experts},)")


def _swiglu_grads(grad_h: torch.Tensor, gate: torch.Tensor, up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``h = silu(gate) * up``: returns ``(h, d gate, d up)`` computed in fp32."""
    gate, up, grad_h = gate.float(), up.float(), grad_h.float()
    sigmoid = torch.sigmoid(gate)
    silu = gate * sigmoid
    grad_gate = grad_h * up * sigmoid * (1 + gate * (1 - sigmoid))
    return silu * up, grad_gate, grad_h * silu


# --------------------------------------------------------------------------- grouped_mm
class _TokenGroups:
    """Group offsets for ``torch._grouped_mm``, padding groups where the device needs it."""

    def __init__(self, num_tokens_per_expert: torch.Tensor, num_rows: int, alignment: int) -> None:
        self.routing = None
        if alignment > 1:
            self.routing = blockwise_routing(num_tokens_per_expert, num_rows=num_rows, block_size=alignment)
            sizes = padded_group_sizes(self.routing, num_tokens_per_expert.shape[0])
        else:
            sizes = num_tokens_per_expert
        self.offsets = torch.cumsum(sizes, dim=0, dtype=torch.int32)

    def pad(self, rows: torch.Tensor) -> torch.Tensor:
        if self.routing is None:
            return rows
        return hidden_with_padding_row(rows).index_select(0, self.routing.token_position_to_id)

    def unpad(self, rows: torch.Tensor) -> torch.Tensor:
        return rows if self.routing is None else rows_from_blocks(rows, self.routing)


def _token_groups(x: torch.Tensor, num_tokens_per_expert: torch.Tensor) -> _TokenGroups:
    alignment = GROUPED_MM_TOKEN_ALIGNMENT.get(x.device.type, 1)
    return _TokenGroups(num_tokens_per_expert, x.shape[0], alignment)


def _grouped_mm_strides_ok(problem: Mapping[str, int]) -> str | None:
    # torch._grouped_mm needs 16-byte aligned strides: multiples of 8 elements in bf16.
    if problem["dim"] % 8 or problem["hidden_dim"] % 8:
        return f"dim={problem['dim']} and hidden_dim={problem['hidden_dim']} must be multiples of 8"
    return None


@register_kernel(
    "moe_swiglu_experts",
    "grouped_mm",
    devices=("cpu", "cuda", "neuron"),
    priority={"cuda": 20, "*": 10},
    shape_check=_grouped_mm_strides_ok,
)
def _grouped_mm_forward(x, w1, w2, w3, num_tokens_per_expert):
    groups = _token_groups(x, num_tokens_per_expert)
    x = groups.pad(x)
    gate = torch._grouped_mm(x, w1.transpose(-2, -1), offs=groups.offsets)
    up = torch._grouped_mm(x, w3.transpose(-2, -1), offs=groups.offsets)
    out = torch._grouped_mm(F.silu(gate) * up, w2.transpose(-2, -1), offs=groups.offsets)
    return groups.unpad(out), groups.unpad(gate), groups.unpad(up)


@register_kernel(
    "moe_swiglu_experts_backward",
    "grouped_mm",
    devices=("cpu", "cuda", "neuron"),
    priority={"cuda": 20, "*": 10},
    shape_check=_grouped_mm_strides_ok,
)
def _grouped_mm_backward(grad_out, x, w1, w2, w3, num_tokens_per_expert, gate, up, out):
    groups = _token_groups(x, num_tokens_per_expert)
    offs = groups.offsets
    grad_out, x, gate, up = groups.pad(grad_out), groups.pad(x), groups.pad(gate), groups.pad(up)
    grad_h = torch._grouped_mm(grad_out, w2, offs=offs)
    h, grad_gate, grad_up = (t.to(x.dtype) for t in _swiglu_grads(grad_h, gate, up))
    grad_x = torch._grouped_mm(grad_gate, w1, offs=offs) + torch._grouped_mm(grad_up, w3, offs=offs)
    # 2D x 2D grouped_mm groups the reduction axis: [F, R] @ [R, D] -> [E, F, D].
    grad_w1 = torch._grouped_mm(grad_gate.t(), x, offs=offs)
    grad_w3 = torch._grouped_mm(grad_up.t(), x, offs=offs)
    grad_w2 = torch._grouped_mm(grad_out.t(), h, offs=offs)
    return groups.unpad(grad_x), grad_w1, grad_w2, grad_w3


# --------------------------------------------------------------------------- per_expert_mm
def matmul_dtype(t: torch.Tensor) -> torch.dtype:
    """The dtype to run matmuls in: fp32 on CPUs without native bf16/fp16 matmul units."""
    if t.device.type != "cpu":
        return t.dtype
    if t.dtype == torch.bfloat16 and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return torch.float32
    if t.dtype == torch.float16 and not torch.ops.mkldnn._is_mkldnn_fp16_supported():
        return torch.float32
    return t.dtype


def _expert_row_ranges(num_tokens_per_expert: torch.Tensor, num_rows: int) -> list[tuple[int, int, int]]:
    """``(expert, start, end)`` of every non-empty expert (host sync on the counts)."""
    counts = num_tokens_per_expert.tolist()
    if sum(counts) != num_rows:
        raise ValueError(f"num_tokens_per_expert sums to {sum(counts)}, but x has {num_rows} rows")
    ranges, start = [], 0
    for expert, count in enumerate(counts):
        if count:
            ranges.append((expert, start, start + count))
        start += count
    return ranges


@register_kernel(
    "moe_swiglu_experts",
    "per_expert_mm",
    devices=("cpu", "cuda"),
    priority={"cpu": 20, "*": 5},
)
def _per_expert_forward(x, w1, w2, w3, num_tokens_per_expert):
    rows, dim = x.shape
    hidden = w1.shape[1]
    out, gate, up = x.new_empty(rows, dim), x.new_empty(rows, hidden), x.new_empty(rows, hidden)
    mm_dtype = matmul_dtype(x)
    for expert, start, end in _expert_row_ranges(num_tokens_per_expert, rows):
        x_e = x[start:end].to(mm_dtype)
        gate_e = x_e @ w1[expert].to(mm_dtype).t()
        up_e = x_e @ w3[expert].to(mm_dtype).t()
        out[start:end] = (F.silu(gate_e) * up_e) @ w2[expert].to(mm_dtype).t()
        gate[start:end] = gate_e
        up[start:end] = up_e
    return out, gate, up


@register_kernel(
    "moe_swiglu_experts_backward",
    "per_expert_mm",
    devices=("cpu", "cuda"),
    priority={"cpu": 20, "*": 5},
)
def _per_expert_backward(grad_out, x, w1, w2, w3, num_tokens_per_expert, gate, up, out):
    grad_x = torch.empty_like(x)
    grad_w1, grad_w2, grad_w3 = torch.empty_like(w1), torch.empty_like(w2), torch.empty_like(w3)
    mm_dtype = matmul_dtype(x)
    ranges = _expert_row_ranges(num_tokens_per_expert, x.shape[0])
    empty_experts = sorted(set(range(w1.shape[0])) - {expert for expert, _, _ in ranges})
    for grad_w in (grad_w1, grad_w2, grad_w3):
        grad_w[empty_experts] = 0
    for expert, start, end in ranges:
        w1_e, w2_e, w3_e = (w[expert].to(mm_dtype) for w in (w1, w2, w3))
        x_e = x[start:end].to(mm_dtype)
        grad_out_e = grad_out[start:end].to(mm_dtype)
        h_e, grad_gate_e, grad_up_e = (t.to(mm_dtype) for t in _swiglu_grads(grad_out_e @ w2_e, gate[start:end], up[start:end]))
        grad_x[start:end] = torch.addmm(grad_gate_e @ w1_e, grad_up_e, w3_e)
        grad_w1[expert] = grad_gate_e.t() @ x_e
        grad_w3[expert] = grad_up_e.t() @ x_e
        grad_w2[expert] = grad_out_e.t() @ h_e
    return grad_x, grad_w1, grad_w2, grad_w3
