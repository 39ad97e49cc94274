"""Pure-torch layouts between torchtitan's MoE tensors and the nki-library blockwise kernels
(``nkilib.core.moe.moe_cte``, ``blockwise_mm_bwd``); the same block layout pads token groups for
devices whose ``_grouped_mm`` needs aligned offsets.

torchtitan: ``w1_EFD``/``w3_EFD`` ``[E, F, D]``, ``w2_EDF`` ``[E, D, F]``, rows ``x [R, D]``
sorted by expert, ``num_tokens_per_expert [E]``. The kernels (H = D, I = F):
``gate_up_proj_weight [E, H, 2, I]``, ``down_proj_weight [E, I, H]``, ``hidden_states [T+1, H]``
(a zero padding row at T), ``token_position_to_id [N*B]`` int32 (T for padding),
``block_to_expert [N, 1]`` int32, ``expert_affinities_masked [(T+1)*E, 1]``.

Each routed row is its own token with affinity 1 for its expert. Shapes are static (the block
count is the worst case over all routings), so everything traces under ``torch.compile`` and
Neuron's static graphs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# Rows every group offset of Trainium's grouped matmul must be a multiple of (torch-neuronx,
# ``torch_neuronx/python_ops/grouped_mm.py``: ``validate_offs``).
NEURON_GROUPED_MM_ALIGNMENT = 128

__all__ = [
    "NEURON_GROUPED_MM_ALIGNMENT",
    "BlockwiseRouting",
    "TokenGroupAlignmentError",
    "TokenGroupPlan",
    "block_gate_up_T_to_rows",
    "blocks_from_rows",
    "blocks_per_expert",
    "blockwise_routing",
    "check_token_group_alignment",
    "down_from_w2",
    "gate_up_from_w1_w3",
    "hidden_with_padding_row",
    "max_num_blocks",
    "padded_group_sizes",
    "row_expert_affinities",
    "rows_from_blocks",
    "rows_to_block_gate_up_T",
    "w1_w3_from_gate_up",
    "w2_from_down",
]


# --------------------------------------------------------------------------- weights
def gate_up_from_w1_w3(w1_EFD: torch.Tensor, w3_EFD: torch.Tensor) -> torch.Tensor:
    """``w1_EFD``, ``w3_EFD`` ``[E, F, D]`` -> ``gate_up [E, D, 2, F]``."""
    return torch.stack([w1_EFD, w3_EFD], dim=2).permute(0, 3, 2, 1).contiguous()


def w1_w3_from_gate_up(gate_up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``gate_up [E, D, 2, F]`` -> ``(w1_EFD, w3_EFD)``."""
    w13_EF2D = gate_up.permute(0, 3, 2, 1)
    return w13_EF2D[:, :, 0, :].contiguous(), w13_EF2D[:, :, 1, :].contiguous()


def down_from_w2(w2_EDF: torch.Tensor) -> torch.Tensor:
    """``w2_EDF [E, D, F]`` -> ``down [E, F, D]``."""
    return w2_EDF.transpose(1, 2).contiguous()


def w2_from_down(down: torch.Tensor) -> torch.Tensor:
    """``down [E, F, D]`` -> ``w2_EDF [E, D, F]``."""
    return down.transpose(1, 2).contiguous()


# --------------------------------------------------------------------------- block routing
def max_num_blocks(num_rows: int, num_experts: int, block_size: int) -> int:
    """Most blocks any routing of ``num_rows`` rows over ``num_experts`` experts can need: the sum
    of ceil(n_e / B) is largest with k = min(E, R) experts non-empty, k - 1 of them holding one
    row, (k - 1) + ceil((R - k + 1) / B)."""
    if num_rows < 0 or num_experts <= 0 or block_size <= 0:
        raise ValueError(f"invalid sizes: rows={num_rows}, experts={num_experts}, block={block_size}")
    nonempty = min(num_experts, num_rows)
    if nonempty == 0:
        return 0
    return (nonempty - 1) + math.ceil((num_rows - nonempty + 1) / block_size)


def blocks_per_expert(num_tokens_per_expert: torch.Tensor, block_size: int) -> torch.Tensor:
    """``ceil(n_e / B)`` for every expert e: the blocks its rows fill (int64)."""
    return (num_tokens_per_expert.to(torch.int64) + block_size - 1) // block_size


@dataclass(frozen=True)
class BlockwiseRouting:
    """Expert-sorted rows laid out in fixed-size blocks, one expert per block: ``position_of_row
    [R]`` (where each row sits) and ``expert_of_row [R]`` int64; ``token_position_to_id`` holds
    ``num_rows`` at padding."""

    token_position_to_id: torch.Tensor
    block_to_expert: torch.Tensor
    position_of_row: torch.Tensor
    expert_of_row: torch.Tensor
    block_size: int
    num_rows: int

    @property
    def num_blocks(self) -> int:
        return self.block_to_expert.shape[0]


def blockwise_routing(
    num_tokens_per_expert: torch.Tensor,
    *,
    num_rows: int,
    block_size: int,
    num_blocks: int | None = None,
) -> BlockwiseRouting:
    """Lay rows sorted by expert into blocks (``num_rows == num_tokens_per_expert.sum()``), by
    default ``max_num_blocks`` of them. Unused trailing blocks hold only the zero padding row and
    are given the last expert, so they add nothing."""
    num_experts = num_tokens_per_expert.shape[0]
    if num_blocks is None:
        num_blocks = max_num_blocks(num_rows, num_experts, block_size)
    device = num_tokens_per_expert.device
    counts = num_tokens_per_expert.to(torch.int64)

    expert_blocks = blocks_per_expert(counts, block_size)
    block_end = torch.cumsum(expert_blocks, dim=0)
    block_start = block_end - expert_blocks
    row_start = torch.cumsum(counts, dim=0) - counts

    experts = torch.arange(num_experts, device=device)
    expert_of_row = torch.repeat_interleave(experts, counts, output_size=num_rows)
    rows = torch.arange(num_rows, device=device)
    position_of_row = block_start[expert_of_row] * block_size + (rows - row_start[expert_of_row])

    token_position_to_id = torch.full((num_blocks * block_size,), num_rows, dtype=torch.int32, device=device).scatter_(
        0, position_of_row, rows.to(torch.int32)
    )
    block_ids = torch.arange(num_blocks, device=device)
    block_to_expert = torch.searchsorted(block_end, block_ids, right=True).clamp_(max=num_experts - 1)
    return BlockwiseRouting(
        token_position_to_id=token_position_to_id,
        block_to_expert=block_to_expert.to(torch.int32).unsqueeze(1),
        position_of_row=position_of_row,
        expert_of_row=expert_of_row,
        block_size=block_size,
        num_rows=num_rows,
    )


def padded_group_sizes(routing: BlockwiseRouting, num_experts: int) -> torch.Tensor:
    """Rows per expert in the block layout (multiples of the block size), summing to N*B."""
    sizes = torch.zeros(num_experts, dtype=torch.int64, device=routing.block_to_expert.device)
    block_rows = torch.full((routing.num_blocks,), routing.block_size, dtype=torch.int64, device=sizes.device)
    return sizes.scatter_add_(0, routing.block_to_expert.flatten().to(torch.int64), block_rows)


# --------------------------------------------------------------------------- activations
def hidden_with_padding_row(x_RD: torch.Tensor) -> torch.Tensor:
    """``[R, D]`` -> ``[R+1, D]`` with a zero row at index R (the padding token)."""
    return torch.cat([x_RD, x_RD.new_zeros(1, x_RD.shape[1])], dim=0)


def rows_from_blocks(blocks: torch.Tensor, routing: BlockwiseRouting) -> torch.Tensor:
    """``[N*B, ...]`` (block positions) -> ``[R, ...]`` (rows)."""
    return blocks.index_select(0, routing.position_of_row)


def blocks_from_rows(rows: torch.Tensor, routing: BlockwiseRouting) -> torch.Tensor:
    """``[R, ...]`` (rows) -> ``[N*B, ...]`` (block positions, zeros at padding)."""
    blocks = rows.new_zeros(routing.num_blocks * routing.block_size, *rows.shape[1:])
    return blocks.index_copy_(0, routing.position_of_row, rows)


def row_expert_affinities(routing: BlockwiseRouting, num_experts: int, dtype: torch.dtype) -> torch.Tensor:
    """``expert_affinities_masked [(R+1)*E, 1]``: 1 for each row's own expert, 0 elsewhere."""
    device = routing.position_of_row.device
    affinities = torch.zeros(routing.num_rows + 1, num_experts, dtype=dtype, device=device)
    rows = torch.arange(routing.num_rows, device=device)
    affinities[rows, routing.expert_of_row] = 1
    return affinities.reshape(-1, 1)


def block_gate_up_T_to_rows(gate_up_T: torch.Tensor, routing: BlockwiseRouting) -> tuple[torch.Tensor, torch.Tensor]:
    """Kernel checkpoint ``gate_up_activations_T [N, 2, F, B]`` -> ``(gate [R, F], up [R, F])``."""
    num_blocks, _, hidden, block = gate_up_T.shape
    by_position = gate_up_T.permute(0, 3, 1, 2).reshape(num_blocks * block, 2, hidden)
    rows = rows_from_blocks(by_position, routing)
    return rows[:, 0].contiguous(), rows[:, 1].contiguous()


def rows_to_block_gate_up_T(gate_RF: torch.Tensor, up_RF: torch.Tensor, routing: BlockwiseRouting) -> torch.Tensor:
    """``(gate [R, F], up [R, F])`` -> ``gate_up_activations_T [N, 2, F, B]``."""
    blocks = blocks_from_rows(torch.stack([gate_RF, up_RF], dim=1), routing)
    hidden = gate_RF.shape[1]
    return blocks.reshape(routing.num_blocks, routing.block_size, 2, hidden).permute(0, 2, 3, 1).contiguous()


# --------------------------------------------------------------------------- alignment check
class TokenGroupAlignmentError(ValueError):
    """A token-group alignment requirement that a configuration cannot meet."""


@dataclass(frozen=True)
class TokenGroupPlan:
    """Static sizes for padding every expert's token group to a multiple of ``alignment``."""

    routed_rows: int
    alignment: int
    max_groups: int
    padded_capacity: int

    @property
    def worst_case_padding_overhead(self) -> float:
        """``padded_capacity / routed_rows``: compute spent per useful row in the worst case."""
        return self.padded_capacity / self.routed_rows


def check_token_group_alignment(
    *,
    tokens_per_step: int,
    top_k: int,
    num_experts: int,
    alignment: int = NEURON_GROUPED_MM_ALIGNMENT,
    pads_token_groups: bool = True,
) -> TokenGroupPlan:
    """The padding plan for MoE token groups aligned to ``alignment`` rows; raises
    ``TokenGroupAlignmentError`` (the numbers and a fix) when they cannot be. ``tokens_per_step``:
    rows one rank routes per MoE layer call. Padded groups (``pads_token_groups``, this package's
    kernels) always can; torchtitan's ``GroupedExperts`` offsets are the raw counts, aligned only
    under balanced routing with ``tokens_per_step * top_k`` a multiple of ``num_experts * alignment``."""
    for name, value in (("tokens_per_step", tokens_per_step), ("top_k", top_k), ("num_experts", num_experts), ("alignment", alignment)):
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise TokenGroupAlignmentError(f"{name} must be a positive integer, got {value!r}")
    if top_k > num_experts:
        raise TokenGroupAlignmentError(f"top_k={top_k} exceeds num_experts={num_experts}")

    routed_rows = tokens_per_step * top_k
    if not pads_token_groups:
        quantum = num_experts * alignment
        if routed_rows % quantum != 0:
            step = quantum // math.gcd(quantum, top_k)
            lower = (tokens_per_step // step) * step
            nearest = [t for t in (lower, lower + step) if t > 0]
            raise TokenGroupAlignmentError(
                f"token groups cannot be aligned to {alignment} rows: each step routes "
                f"tokens_per_step * top_k = {tokens_per_step} * {top_k} = {routed_rows} rows over "
                f"{num_experts} experts, and unpadded group offsets are multiples of {alignment} "
                f"only if every expert gets a multiple of {alignment} rows, which needs at least "
                f"balanced routing and rows divisible by num_experts * alignment = {quantum}. "
                f"Use a kernel that pads token groups (backend.kernels=auto, grouped_mm or nki), or set "
                f"seq_len * local_batch_size to a multiple of {step} (nearest: {nearest}) and force "
                f"balanced routing."
            )
    groups = max_num_blocks(routed_rows, num_experts, alignment)
    return TokenGroupPlan(
        routed_rows=routed_rows,
        alignment=alignment,
        max_groups=groups,
        padded_capacity=groups * alignment,
    )
