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
  need aligned group offsets (Neuron: 128 rows), and on CPUs whose bf16/fp16 matmuls run through
  oneDNN (16 rows: see ``ONEDNN_TOKEN_ALIGNMENT``), each expert's group is padded in a buffer
  first (of static size on Neuron). The default on CPU and CUDA (``benchmarks/experts_in_training.py``:
  on CPU, inside training, ahead of torchtitan's ``GroupedExperts`` and of the other two); the
  only portable one on Neuron.
* ``per_expert_mm``: one dense matmul per non-empty expert, written straight into row slices
  of the outputs; the SwiGLU and its gradient run once over all rows. On CPUs without native
  bf16 matmul (no AVX512-BF16/AMX) bf16 inputs are upcast once to fp32 for the matmuls, which
  is what bf16 tensor cores do too (bf16 operands, fp32 accumulation); outputs are stored in
  the input dtype. Reads the counts on the host once per call (free on CPU, a device sync
  elsewhere).

Both compute in the dtype of their inputs; neither copies weights.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F

from .layouts import (
    blocks_per_expert,
    blockwise_routing,
    hidden_with_padding_row,
    padded_group_sizes,
    rows_from_blocks,
)
from .registry import (
    KernelChoice,
    OpDeclaration,
    declare_op,
    register_kernel,
    resolve_op,
)

__all__ = [
    "GROUPED_MM_TOKEN_ALIGNMENT",
    "ONEDNN_TOKEN_ALIGNMENT",
    "MOE_SWIGLU_EXPERTS",
    "MOE_SWIGLU_EXPERTS_BACKWARD",
    "expert_row_ranges",
    "TokenGroups",
    "grouped_mm_token_alignment",
    "grouped_mm_token_groups",
    "in_matmul_dtype",
    "matmul_dtype",
    "moe_problem",
    "moe_swiglu_experts",
    "native_half_matmul",
    "swiglu",
    "swiglu_backward",
]

# Devices whose grouped matmul needs every group offset to be a multiple of this many rows.
GROUPED_MM_TOKEN_ALIGNMENT: dict[str, int] = {"neuron": 128}
# CPU matmuls in bf16/fp16 on native units run through oneDNN, which JIT-compiles a kernel for
# every new shape and keeps 1024 of them (its primitive cache). Expert group sizes change every
# step, so exact groups make most of the expert matmuls new shapes: inside training they took
# ~4x what the same calls take on shapes seen before, more as the cache thrashed
# (benchmarks/grouped_mm_in_training.py --exact-groups). Groups padded to 16 rows, an AMX tile's
# height, keep the shapes to at most 32 per projection for 512 tokens. fp32 matmuls go to MKL,
# whose time does not depend on shapes seen before; there padding would only add rows.
ONEDNN_TOKEN_ALIGNMENT = 16
# Devices whose padded groups live in a buffer of static size (compiled graphs: the most blocks
# any routing can need, the unused ones given to the last expert). Elsewhere the buffer holds
# just the blocks this routing needs, counted on the host (free on CPU), so no expert computes
# rows that are all padding.
STATIC_TOKEN_BUFFER_DEVICES = frozenset({"neuron"})


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


def moe_problem(*, dim: int, hidden_dim: int, num_experts: int, **known: int) -> dict[str, int]:
    """The shape description kernels' shape checks receive: one rank's expert weights, and what
    else is known before a call (``tokens``: rows per call, ``logical_cores``)."""
    return {"dim": dim, "hidden_dim": hidden_dim, "num_experts": num_experts, **known}


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


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate).mul_(up)


def swiglu_backward(grad_h: torch.Tensor, gate: torch.Tensor, up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``h = silu(gate) * up``: returns ``(h, d gate, d up)`` in the inputs' dtype.

    Four elementwise passes; ``silu`` and ``silu_backward`` compute in fp32 internally for
    bf16 inputs, as autograd through ``GroupedExperts``' SwiGLU does.
    """
    silu = F.silu(gate)
    grad_up = grad_h * silu
    grad_gate = torch.ops.aten.silu_backward(grad_h.mul_(up), gate)
    return silu.mul_(up), grad_gate, grad_up


# --------------------------------------------------------------------------- grouped_mm
class TokenGroups:
    """Group offsets for ``torch._grouped_mm``, padding groups where the device needs it."""

    def __init__(self, num_tokens_per_expert: torch.Tensor, num_rows: int, alignment: int, static_size: bool) -> None:
        self.routing = None
        if alignment > 1:
            num_blocks = None  # blockwise_routing's static bound
            if not static_size:
                num_blocks = max(1, int(blocks_per_expert(num_tokens_per_expert, alignment).sum()))
            self.routing = blockwise_routing(num_tokens_per_expert, num_rows=num_rows, block_size=alignment, num_blocks=num_blocks)
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


def grouped_mm_token_alignment(x: torch.Tensor) -> int:
    """Rows each expert's group is padded to for ``torch._grouped_mm`` on ``x``'s device and dtype."""
    device = x.device.type
    if device in GROUPED_MM_TOKEN_ALIGNMENT:
        return GROUPED_MM_TOKEN_ALIGNMENT[device]
    return ONEDNN_TOKEN_ALIGNMENT if device == "cpu" and native_half_matmul(x.dtype) else 1


def grouped_mm_token_groups(x: torch.Tensor, num_tokens_per_expert: torch.Tensor) -> TokenGroups:
    """The groups the ``grouped_mm`` kernel runs ``x``'s rows in (padded where the device needs it)."""
    static_size = x.device.type in STATIC_TOKEN_BUFFER_DEVICES
    return TokenGroups(num_tokens_per_expert, x.shape[0], grouped_mm_token_alignment(x), static_size)


def _grouped_mm_strides_ok(problem: Mapping[str, int]) -> str | None:
    # torch._grouped_mm needs 16-byte aligned strides: multiples of 8 elements in bf16.
    if problem["dim"] % 8 or problem["hidden_dim"] % 8:
        return f"dim={problem['dim']} and hidden_dim={problem['hidden_dim']} must be multiples of 8"
    return None


@register_kernel(
    "moe_swiglu_experts",
    "grouped_mm",
    devices=("cpu", "cuda", "neuron"),
    priority={"cuda": 20, "cpu": 40, "*": 10},
    shape_check=_grouped_mm_strides_ok,
)
def _grouped_mm_forward(x, w1, w2, w3, num_tokens_per_expert):
    groups = grouped_mm_token_groups(x, num_tokens_per_expert)
    x = groups.pad(x)
    gate = torch._grouped_mm(x, w1.transpose(-2, -1), offs=groups.offsets)
    up = torch._grouped_mm(x, w3.transpose(-2, -1), offs=groups.offsets)
    out = torch._grouped_mm(swiglu(gate, up), w2.transpose(-2, -1), offs=groups.offsets)
    return groups.unpad(out), groups.unpad(gate), groups.unpad(up)


@register_kernel(
    "moe_swiglu_experts_backward",
    "grouped_mm",
    devices=("cpu", "cuda", "neuron"),
    priority={"cuda": 20, "cpu": 40, "*": 10},
    shape_check=_grouped_mm_strides_ok,
)
def _grouped_mm_backward(grad_out, x, w1, w2, w3, num_tokens_per_expert, gate, up, out):
    groups = grouped_mm_token_groups(x, num_tokens_per_expert)
    offs = groups.offsets
    grad_out, x, gate, up = groups.pad(grad_out), groups.pad(x), groups.pad(gate), groups.pad(up)
    h, grad_gate, grad_up = swiglu_backward(torch._grouped_mm(grad_out, w2, offs=offs), gate, up)
    grad_x = torch._grouped_mm(grad_gate, w1, offs=offs).add_(torch._grouped_mm(grad_up, w3, offs=offs))
    # 2D x 2D grouped_mm groups the reduction axis: [F, R] @ [R, D] -> [E, F, D]; experts
    # without rows get zeros.
    grad_w1 = torch._grouped_mm(grad_gate.t(), x, offs=offs)
    grad_w3 = torch._grouped_mm(grad_up.t(), x, offs=offs)
    grad_w2 = torch._grouped_mm(grad_out.t(), h, offs=offs)
    return groups.unpad(grad_x), grad_w1, grad_w2, grad_w3


# --------------------------------------------------------------------------- per_expert_mm
def native_half_matmul(dtype: torch.dtype) -> bool:
    """Whether this CPU runs ``dtype`` (bf16 or fp16) matmuls on native units, through oneDNN."""
    if dtype == torch.bfloat16:
        return torch.ops.mkldnn._is_mkldnn_bf16_supported()
    if dtype == torch.float16:
        return torch.ops.mkldnn._is_mkldnn_fp16_supported()
    return False


def matmul_dtype(t: torch.Tensor) -> torch.dtype:
    """The dtype to run matmuls in: fp32 on CPUs without native bf16/fp16 matmul units."""
    if t.device.type == "cpu" and t.dtype in (torch.bfloat16, torch.float16) and not native_half_matmul(t.dtype):
        return torch.float32
    return t.dtype


def expert_row_ranges(num_tokens_per_expert: torch.Tensor, num_rows: int) -> tuple[list[tuple[int, int, int]], list[int]]:
    """``(expert, start, end)`` of every non-empty expert, and the empty experts.

    Reads the counts on the host once (free on CPU; one device sync elsewhere).
    """
    counts = num_tokens_per_expert.tolist()
    if sum(counts) != num_rows:
        raise ValueError(f"num_tokens_per_expert sums to {sum(counts)}, but x has {num_rows} rows")
    ranges, empty, start = [], [], 0
    for expert, count in enumerate(counts):
        if count:
            ranges.append((expert, start, start + count))
        else:
            empty.append(expert)
        start += count
    return ranges, empty


def in_matmul_dtype(kernel):
    """Run ``kernel`` on inputs upcast once to the matmul dtype (fp32 where bf16/fp16 matmuls are
    emulated), casting its outputs back; a plain call where the input dtype is native."""

    @functools.wraps(kernel)
    def wrapper(*tensors):
        dtype = tensors[0].dtype
        mm_dtype = matmul_dtype(tensors[0])
        if mm_dtype == dtype:
            return kernel(*tensors)
        upcast = (t if not t.is_floating_point() else t.to(mm_dtype) for t in tensors)
        return tuple(t.to(dtype) for t in kernel(*upcast))

    return wrapper


# Matmuls write straight into row slices of the outputs (``out=``) and weight-gradient slots, and
# the SwiGLU runs once over all rows: per expert only the matmuls are launched.
@register_kernel(
    "moe_swiglu_experts",
    "per_expert_mm",
    devices=("cpu", "cuda"),
    priority={"cpu": 20, "*": 5},
)
@in_matmul_dtype
def _per_expert_forward(x, w1, w2, w3, num_tokens_per_expert):
    rows, dim = x.shape
    hidden = w1.shape[1]
    ranges, _empty = expert_row_ranges(num_tokens_per_expert, rows)
    gate, up, out = x.new_empty(rows, hidden), x.new_empty(rows, hidden), x.new_empty(rows, dim)
    for expert, start, end in ranges:
        torch.mm(x[start:end], w1[expert].t(), out=gate[start:end])
        torch.mm(x[start:end], w3[expert].t(), out=up[start:end])
    h = swiglu(gate, up)
    for expert, start, end in ranges:
        torch.mm(h[start:end], w2[expert].t(), out=out[start:end])
    return out, gate, up


@register_kernel(
    "moe_swiglu_experts_backward",
    "per_expert_mm",
    devices=("cpu", "cuda"),
    priority={"cpu": 20, "*": 5},
)
@in_matmul_dtype
def _per_expert_backward(grad_out, x, w1, w2, w3, num_tokens_per_expert, gate, up, out):
    ranges, empty = expert_row_ranges(num_tokens_per_expert, x.shape[0])
    grad_h = torch.empty_like(gate)
    for expert, start, end in ranges:
        torch.mm(grad_out[start:end], w2[expert], out=grad_h[start:end])
    h, grad_gate, grad_up = swiglu_backward(grad_h, gate, up)
    grad_x = torch.empty_like(x)
    grad_w1, grad_w2, grad_w3 = torch.empty_like(w1), torch.empty_like(w2), torch.empty_like(w3)
    for expert, start, end in ranges:
        rows = slice(start, end)
        torch.mm(grad_gate[rows], w1[expert], out=grad_x[rows]).addmm_(grad_up[rows], w3[expert])
        torch.mm(grad_gate[rows].t(), x[rows], out=grad_w1[expert])
        torch.mm(grad_up[rows].t(), x[rows], out=grad_w3[expert])
        torch.mm(grad_out[rows].t(), h[rows], out=grad_w2[expert])
    if empty:
        empty_experts = torch.tensor(empty, device=x.device)
        for grad_w in (grad_w1, grad_w2, grad_w3):
            grad_w.index_fill_(0, empty_experts, 0)
    return grad_x, grad_w1, grad_w2, grad_w3
