"""``padded_bmm``: the expert MLP as batched matmuls over a per-expert padded layout.

Rows sorted by expert are copied into ``[E, C, D]`` (zeros after each expert's rows), so each
projection and weight gradient is one ``torch.bmm`` against the weights as they are; zero rows
change no value or gradient. Why: on a few shared CPU cores the per-expert loop's many small
matmuls, each its own parallel region, cost more than their FLOPs (``benchmarks/moe_kernels.py``).

``C`` is chosen per call from the counts (``padded_capacity``); rows beyond it run as per-expert
matmuls. The cost constants are measured orders of magnitude
(``python benchmarks/moe_kernels.py --costs``). Reads the counts on the host once per call.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .moe import in_matmul_dtype, swiglu, swiglu_backward
from .registry import ExpertKernel, register_kernel

__all__ = ["BATCHED_PASS_ROWS", "GROUP_LAUNCH_ROWS", "PADDED_BMM", "PaddedExpertRows", "padded_capacity"]

# The cost of one expert's per-expert matmul beyond its FLOPs, in rows of compute (measured with
# cold caches, as in training, where other experts' weights pass through between two calls).
GROUP_LAUNCH_ROWS = 256
# The cost of the batched pass beyond its FLOPs, per expert, in rows of compute.
BATCHED_PASS_ROWS = 40


def padded_capacity(counts: list[int]) -> int:
    """The ``C`` minimising ``sum(max(n_e - C, 0)) + GROUP_LAUNCH_ROWS * #{e: n_e > C}`` plus, for
    ``C > 0``, ``E * (C + BATCHED_PASS_ROWS)``.

    The minimum lies at one of the counts or at 0; with the counts sorted descending, the experts
    above the candidate ``d[k]`` (the first of its ties) are exactly the first ``k``.
    """
    experts = len(counts)
    descending = sorted(counts, reverse=True) + [0]
    best, best_cost, above = 0, float("inf"), 0  # above: sum of the first k counts
    for k, candidate in enumerate(descending):
        if k == 0 or descending[k - 1] != candidate:
            batched = experts * (candidate + BATCHED_PASS_ROWS) if candidate else 0
            cost = batched + (above - k * candidate) + GROUP_LAUNCH_ROWS * k
            if cost < best_cost:
                best, best_cost = candidate, cost
        above += candidate
    return best


@dataclass(frozen=True)
class PaddedExpertRows:
    """Where each row sorted by expert sits in the ``[E, C]`` padded layout."""

    num_experts: int
    capacity: int
    num_rows: int
    # Padded position (e * C + i) of every row within capacity, and which rows those are
    # (None: all rows, in order).
    position: torch.Tensor
    rows_in_capacity: torch.Tensor | None
    # (expert, start, end) row slices beyond capacity.
    overflow: tuple[tuple[int, int, int], ...]

    @classmethod
    def of(cls, num_tokens_per_expert: torch.Tensor, num_rows: int) -> PaddedExpertRows:
        counts = num_tokens_per_expert.tolist()
        if sum(counts) != num_rows:
            raise ValueError(f"num_tokens_per_expert sums to {sum(counts)}, but x has {num_rows} rows")
        experts = len(counts)
        capacity = padded_capacity(counts)
        device = num_tokens_per_expert.device
        counts_t = num_tokens_per_expert.to(torch.int64)
        expert_of_row = torch.repeat_interleave(torch.arange(experts, device=device), counts_t, output_size=num_rows)
        row_start = torch.cumsum(counts_t, dim=0) - counts_t
        index_in_expert = torch.arange(num_rows, device=device) - row_start[expert_of_row]
        position = expert_of_row * capacity + index_in_expert
        overflow, rows_in_capacity, start = [], None, 0
        for expert, count in enumerate(counts):
            if count > capacity:
                overflow.append((expert, start + capacity, start + count))
            start += count
        if overflow:
            keep = index_in_expert < capacity
            rows_in_capacity = torch.arange(num_rows, device=device)[keep]
            position = position[keep]
        return cls(experts, capacity, num_rows, position, rows_in_capacity, tuple(overflow))

    def scatter(self, rows: torch.Tensor) -> torch.Tensor:
        """``[R, K]`` -> ``[E, C, K]`` with zeros in padding slots."""
        if self.rows_in_capacity is not None:
            rows = rows.index_select(0, self.rows_in_capacity)
        padded = rows.new_zeros(self.num_experts * self.capacity, rows.shape[1])
        return padded.index_copy_(0, self.position, rows).view(self.num_experts, self.capacity, rows.shape[1])

    def gather(self, padded: torch.Tensor) -> torch.Tensor:
        """``[E, C, K]`` -> ``[R, K]``; rows beyond capacity are left for the caller to fill."""
        flat = padded.flatten(0, 1)
        if self.rows_in_capacity is None:
            return flat.index_select(0, self.position)
        rows = flat.new_empty(self.num_rows, flat.shape[1])
        return rows.index_copy_(0, self.rows_in_capacity, flat.index_select(0, self.position))


@in_matmul_dtype
def _padded_forward(x, w1, w2, w3, num_tokens_per_expert):
    layout = PaddedExpertRows.of(num_tokens_per_expert, x.shape[0])
    x_p = layout.scatter(x)
    gate_p = torch.bmm(x_p, w1.transpose(1, 2))
    up_p = torch.bmm(x_p, w3.transpose(1, 2))
    out_p = torch.bmm(swiglu(gate_p, up_p), w2.transpose(1, 2))
    out, gate, up = layout.gather(out_p), layout.gather(gate_p), layout.gather(up_p)
    for expert, start, end in layout.overflow:
        rows = slice(start, end)
        torch.mm(x[rows], w1[expert].t(), out=gate[rows])
        torch.mm(x[rows], w3[expert].t(), out=up[rows])
        torch.mm(swiglu(gate[rows], up[rows]), w2[expert].t(), out=out[rows])
    return out, gate, up


@in_matmul_dtype
def _padded_backward(grad_out, x, w1, w2, w3, num_tokens_per_expert, gate, up, out):
    layout = PaddedExpertRows.of(num_tokens_per_expert, x.shape[0])
    grad_out_p = layout.scatter(grad_out)
    h_p, grad_gate_p, grad_up_p = swiglu_backward(torch.bmm(grad_out_p, w2), layout.scatter(gate), layout.scatter(up))
    grad_x = layout.gather(torch.bmm(grad_gate_p, w1).baddbmm_(grad_up_p, w3))
    x_p = layout.scatter(x)
    grad_w1 = torch.bmm(grad_gate_p.transpose(1, 2), x_p)
    grad_w3 = torch.bmm(grad_up_p.transpose(1, 2), x_p)
    grad_w2 = torch.bmm(grad_out_p.transpose(1, 2), h_p)
    for expert, start, end in layout.overflow:
        rows = slice(start, end)
        h, grad_gate, grad_up = swiglu_backward(grad_out[rows] @ w2[expert], gate[rows], up[rows])
        torch.mm(grad_gate, w1[expert], out=grad_x[rows]).addmm_(grad_up, w3[expert])
        grad_w1[expert].addmm_(grad_gate.t(), x[rows])
        grad_w3[expert].addmm_(grad_up.t(), x[rows])
        grad_w2[expert].addmm_(grad_out[rows].t(), h)
    return grad_x, grad_w1, grad_w2, grad_w3


PADDED_BMM = register_kernel(ExpertKernel("padded_bmm", _padded_forward, _padded_backward))
