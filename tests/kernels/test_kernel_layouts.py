"""Layout conversions to and from the NKI kernels' layouts are exact; the token-group alignment check."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from qwen3_trn.kernels import TokenGroupAlignmentError, check_token_group_alignment
from qwen3_trn.kernels.layouts import (
    block_gate_up_T_to_rows,
    blocks_from_rows,
    blockwise_routing,
    down_from_w2,
    gate_up_from_w1_w3,
    hidden_with_padding_row,
    max_num_blocks,
    padded_group_sizes,
    row_expert_affinities,
    rows_from_blocks,
    rows_to_block_gate_up_T,
    w1_w3_from_gate_up,
    w2_from_down,
)

E, F, D = 5, 12, 8


def test_weight_layouts_round_trip_exactly_and_index_as_documented():
    w1, w3, w2 = torch.randn(E, F, D), torch.randn(E, F, D), torch.randn(E, D, F)
    gate_up = gate_up_from_w1_w3(w1, w3)
    assert gate_up.shape == (E, D, 2, F)
    assert gate_up[3, 5, 0, 7] == w1[3, 7, 5] and gate_up[3, 5, 1, 7] == w3[3, 7, 5]
    back_w1, back_w3 = w1_w3_from_gate_up(gate_up)
    assert torch.equal(back_w1, w1) and torch.equal(back_w3, w3)
    down = down_from_w2(w2)
    assert down.shape == (E, F, D) and down[2, 4, 6] == w2[2, 6, 4]
    assert torch.equal(w2_from_down(down), w2)
    # The kernel's gate projection, hidden @ gate_up[e][:, 0], is torchtitan's x @ w1[e].T.
    x = torch.randn(3, D)
    torch.testing.assert_close(x @ gate_up[1, :, 0, :], x @ w1[1].t())
    torch.testing.assert_close((x @ w1[1].t()) @ down[1], (x @ w1[1].t()) @ w2[1].t())


@pytest.mark.parametrize("counts", [[5, 0, 9, 3, 0], [0, 0, 0, 0, 4], [1, 1, 1, 1, 1], [8, 0, 0, 0, 0]])
@pytest.mark.parametrize("block_size", [1, 4, 128])
def test_blockwise_routing_places_every_row_once_in_its_experts_blocks(counts, block_size):
    counts = torch.tensor(counts)
    rows = int(counts.sum())
    routing = blockwise_routing(counts, num_rows=rows, block_size=block_size)
    assert routing.num_blocks == max_num_blocks(rows, E, block_size)
    assert routing.token_position_to_id.dtype == torch.int32 and routing.block_to_expert.dtype == torch.int32
    ids = routing.token_position_to_id
    assert sorted(ids[ids < rows].tolist()) == list(range(rows))
    assert int((ids == rows).sum()) == routing.num_blocks * block_size - rows
    expert_of_position = routing.block_to_expert.flatten().repeat_interleave(block_size)
    expected_expert = torch.repeat_interleave(torch.arange(E), counts)
    assert torch.equal(expert_of_position[routing.position_of_row].long(), expected_expert)
    assert torch.equal(ids[routing.position_of_row].long(), torch.arange(rows))
    # the layout alone (blocks' experts, padding ids) gives back the counts
    assert torch.equal(torch.bincount(expert_of_position[ids < rows].long(), minlength=E), counts)
    sizes = padded_group_sizes(routing, E)
    assert int(sizes.sum()) == routing.num_blocks * block_size
    assert all(size % block_size == 0 and size >= count for size, count in zip(sizes.tolist(), counts.tolist()))


def test_row_and_block_activations_round_trip_exactly():
    counts = torch.tensor([5, 0, 9, 3, 1])
    rows = int(counts.sum())
    routing = blockwise_routing(counts, num_rows=rows, block_size=4)
    x = torch.randn(rows, D)
    assert torch.equal(rows_from_blocks(blocks_from_rows(x, routing), routing), x)
    padded = hidden_with_padding_row(x)
    assert padded.shape == (rows + 1, D) and torch.count_nonzero(padded[rows]) == 0
    # gathering the padded hidden states by token_position_to_id is the block layout of x
    assert torch.equal(padded[routing.token_position_to_id.long()], blocks_from_rows(x, routing))

    gate, up = torch.randn(rows, F), torch.randn(rows, F)
    gate_up_T = rows_to_block_gate_up_T(gate, up, routing)
    assert gate_up_T.shape == (routing.num_blocks, 2, F, 4)
    back_gate, back_up = block_gate_up_T_to_rows(gate_up_T, routing)
    assert torch.equal(back_gate, gate) and torch.equal(back_up, up)

    affinities = row_expert_affinities(routing, E, torch.bfloat16).reshape(rows + 1, E)
    assert torch.equal(affinities.sum(dim=1), torch.tensor([1.0] * rows + [0.0], dtype=torch.bfloat16))
    assert torch.equal(affinities[:rows].argmax(dim=1), torch.repeat_interleave(torch.arange(E), counts))


def test_max_num_blocks_is_the_worst_case_over_all_routings():
    for rows, experts, block in itertools.product(range(0, 9), (1, 2, 3), (1, 2, 3)):
        worst = max(
            (
                sum(math.ceil(c / block) for c in split)
                for split in itertools.product(range(rows + 1), repeat=experts)
                if sum(split) == rows
            ),
            default=0,
        )
        assert max_num_blocks(rows, experts, block) == worst, (rows, experts, block)


def test_blockwise_routing_traces_with_static_shapes_under_fake_tensors():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        routing = blockwise_routing(torch.empty(64, dtype=torch.int64), num_rows=4096, block_size=256)
        assert routing.token_position_to_id.shape == (max_num_blocks(4096, 64, 256) * 256,)


def test_token_group_alignment_with_padding_reports_static_capacity():
    plan = check_token_group_alignment(tokens_per_step=512, top_k=8, num_experts=64, alignment=128)
    assert plan.routed_rows == 4096
    assert plan.max_groups == max_num_blocks(4096, 64, 128) == 63 + math.ceil((4096 - 63) / 128)
    assert plan.padded_capacity == plan.max_groups * 128
    assert plan.worst_case_padding_overhead == pytest.approx(plan.padded_capacity / 4096)


def test_token_group_alignment_without_padding_needs_balanced_divisible_rows():
    ok = check_token_group_alignment(tokens_per_step=8192, top_k=8, num_experts=64, alignment=128, pads_token_groups=False)
    assert ok.routed_rows == 65536
    with pytest.raises(TokenGroupAlignmentError) as error:
        check_token_group_alignment(tokens_per_step=512, top_k=8, num_experts=64, alignment=128, pads_token_groups=False)
    message = str(error.value)
    assert "512 * 8 = 4096 rows" in message and "num_experts * alignment = 8192" in message
    assert "multiple of 1024 (nearest: [1024])" in message and "kernels=auto" in message


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(tokens_per_step=0, top_k=8, num_experts=64), "tokens_per_step must be a positive integer"),
        (dict(tokens_per_step=512, top_k=8, num_experts=64, alignment=0), "alignment must be a positive integer"),
        (dict(tokens_per_step=512, top_k=9, num_experts=8), "top_k=9 exceeds num_experts=8"),
    ],
)
def test_token_group_alignment_rejects_invalid_configs(kwargs, match):
    with pytest.raises(TokenGroupAlignmentError, match=match):
        check_token_group_alignment(**kwargs)
    assert issubclass(TokenGroupAlignmentError, ValueError)
