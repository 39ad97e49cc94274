"""The MoE expert operator's math, its call wrapper and its default kernel, ``grouped_mm``.

``moe_swiglu_experts(x [R, D], w1 [E, F, D], w2 [E, D, F], w3 [E, F, D], num_tokens_per_expert [E])``
computes ``(silu(x @ w1[e].T) * (x @ w3[e].T)) @ w2[e].T`` on each expert e's rows, as
torchtitan's ``GroupedExperts``. Rows are sorted by expert and ``R == num_tokens_per_expert.sum()``
(padding rows counted in). Kernels return ``(out, gate, up)``; ``gate`` and ``up`` are saved for
backward so no kernel recomputes them.

``grouped_mm`` is ``torch._grouped_mm`` in the input dtype, with each group padded in a buffer
where the device needs aligned offsets (Neuron: 128 rows; oneDNN bf16/fp16 on CPU: 16).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import torch
import torch.nn.functional as F

from .layouts import (
    NEURON_GROUPED_MM_ALIGNMENT,
    blocks_per_expert,
    blockwise_routing,
    hidden_with_padding_row,
    padded_group_sizes,
    rows_from_blocks,
)
from .registry import ExpertKernel, register_kernel, resolve_op

__all__ = [
    "GROUPED_MM",
    "GROUPED_MM_TOKEN_ALIGNMENT",
    "ONEDNN_TOKEN_ALIGNMENT",
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
GROUPED_MM_TOKEN_ALIGNMENT: dict[str, int] = {"neuron": NEURON_GROUPED_MM_ALIGNMENT}
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


def moe_problem(*, dim: int, hidden_dim: int, num_experts: int, **known: int) -> dict[str, int]:
    """What kernels' shape checks receive: one rank's expert weights and, where known, ``tokens``
    (rows per call) and ``logical_cores``."""
    return {"dim": dim, "hidden_dim": hidden_dim, "num_experts": num_experts, **known}


def moe_swiglu_experts(
    x: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    w3: torch.Tensor,
    num_tokens_per_expert: torch.Tensor,
    *,
    kernel: str = "auto",
) -> torch.Tensor:
    """Expert outputs ``[R, D]``; ``kernel`` is ``auto | portable | <name>``."""
    _check_inputs(x, w1, w2, w3, num_tokens_per_expert)
    problem = moe_problem(dim=x.shape[1], hidden_dim=w1.shape[1], num_experts=w1.shape[0])
    op = resolve_op(kernel, x.device.type, problem)
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
    """``h = silu(gate) * up``: returns ``(h, d gate, d up)`` in the inputs' dtype; ``silu`` runs in
    fp32 for bf16 inputs, as autograd through ``GroupedExperts`` does."""
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


def _grouped_mm_forward(x, w1, w2, w3, num_tokens_per_expert):
    groups = grouped_mm_token_groups(x, num_tokens_per_expert)
    x = groups.pad(x)
    gate = torch._grouped_mm(x, w1.transpose(-2, -1), offs=groups.offsets)
    up = torch._grouped_mm(x, w3.transpose(-2, -1), offs=groups.offsets)
    out = torch._grouped_mm(swiglu(gate, up), w2.transpose(-2, -1), offs=groups.offsets)
    return groups.unpad(out), groups.unpad(gate), groups.unpad(up)


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


GROUPED_MM = register_kernel(ExpertKernel("grouped_mm", _grouped_mm_forward, _grouped_mm_backward, shape_check=_grouped_mm_strides_ok))


# --------------------------------------------------------------------------- matmul dtype on CPU
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


def in_matmul_dtype(kernel):
    """Run ``kernel`` on inputs upcast once to the matmul dtype (fp32 where bf16/fp16 matmuls are
    emulated; bf16 tensor cores also accumulate in fp32), casting outputs back."""

    @functools.wraps(kernel)
    def wrapper(*tensors):
        dtype = tensors[0].dtype
        mm_dtype = matmul_dtype(tensors[0])
        if mm_dtype == dtype:
            return kernel(*tensors)
        upcast = (t if not t.is_floating_point() else t.to(mm_dtype) for t in tensors)
        return tuple(t.to(dtype) for t in kernel(*upcast))

    return wrapper
