"""moe_swiglu_experts: every portable kernel matches torchtitan's GroupedExperts, values and grads."""

from __future__ import annotations

import pytest
import torch
from torchtitan.models.common.moe import GroupedExperts

from qwen3_trn.kernels import KERNELS, KernelGroupedExperts, moe_swiglu_experts, select_kernel
from qwen3_trn.kernels import moe as moe_module
from qwen3_trn.kernels.nki_moe import (
    blockwise_moe_backward_reference,
    blockwise_moe_reference,
    nki_moe_backward_with,
    nki_moe_forward_with,
)

PORTABLE = sorted(name for name, kernel in KERNELS.items() if kernel.portable)
E, F, D = 6, 48, 32
# Experts 1 and 4 receive no rows: their weight gradients must be exactly zero.
COUNTS = torch.tensor([5, 0, 9, 3, 0, 7])


def test_every_portable_kernel_is_registered():
    assert PORTABLE == ["grouped_mm", "padded_bmm"]


def _torchtitan_experts(seed: int = 0) -> GroupedExperts:
    module = GroupedExperts.Config(dim=D, hidden_dim=F, num_experts=E).build()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in module.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * 0.2)
    return module


def _run(module, x, counts, grad):
    x = x.detach().requires_grad_()
    module.zero_grad(set_to_none=True)
    out = module(x, counts)
    out.backward(grad)
    return out.detach(), [x.grad, module.w1_EFD.grad, module.w2_EDF.grad, module.w3_EFD.grad]


def _fp64_reference(x, w1, w2, w3, counts, grad):
    """The math, expert by expert, in float64 autograd."""
    x, w1, w2, w3 = (t.detach().double().requires_grad_() for t in (x, w1, w2, w3))
    outs, start = [], 0
    for expert, count in enumerate(counts.tolist()):
        rows = x[start : start + count]
        h = torch.nn.functional.silu(rows @ w1[expert].t()) * (rows @ w3[expert].t())
        outs.append(h @ w2[expert].t())
        start += count
    out = torch.cat(outs)
    out.backward(grad.double())
    return out.detach(), [x.grad, w1.grad, w2.grad, w3.grad]


def _assert_bf16_close(actual, expected):
    # torchtitan rounds operands and outputs to bf16: compare at bf16 resolution of the scale.
    scale = expected.abs().max().item()
    torch.testing.assert_close(actual.double(), expected.double(), rtol=0, atol=2e-2 * scale)


@pytest.mark.parametrize("kernel", PORTABLE)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_experts_match_torchtitan_values_and_grads(kernel, dtype):
    reference = _torchtitan_experts().to(dtype)
    ours = KernelGroupedExperts.Config(dim=D, hidden_dim=F, num_experts=E, kernel=kernel).build().to(dtype)
    ours.load_state_dict(reference.state_dict())
    rows = int(COUNTS.sum())
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(rows, D, generator=generator).to(dtype)
    grad = torch.randn(rows, D, generator=generator).to(dtype)

    ref_out, ref_grads = _run(reference, x, COUNTS, grad)
    out, grads = _run(ours, x, COUNTS, grad)
    exact_out, exact_grads = _fp64_reference(x, reference.w1_EFD, reference.w2_EDF, reference.w3_EFD, COUNTS, grad)

    assert out.dtype == dtype and out.shape == (rows, D)
    _assert_bf16_close(out, ref_out)
    _assert_bf16_close(out, exact_out)
    for name, got, theirs, exact in zip(["x", "w1", "w2", "w3"], grads, ref_grads, exact_grads):
        assert got.dtype == dtype, name
        _assert_bf16_close(got, theirs)
        _assert_bf16_close(got, exact)
    for weight_grad in grads[1:]:
        assert torch.count_nonzero(weight_grad[[1, 4]]) == 0
        assert torch.count_nonzero(weight_grad[[0, 2, 3, 5]]) > 0


@pytest.mark.parametrize("kernel", PORTABLE)
def test_kernel_without_empty_experts_and_with_a_single_expert(kernel):
    for counts in (torch.tensor([2, 3, 1, 4, 2, 5]), torch.tensor([0, 0, 11, 0, 0, 0])):
        rows = int(counts.sum())
        x = torch.randn(rows, D, dtype=torch.bfloat16, requires_grad=True)
        weights = [(torch.randn(*shape) * 0.2).bfloat16().requires_grad_() for shape in ((E, F, D), (E, D, F), (E, F, D))]
        out = moe_swiglu_experts(x, *weights, counts, kernel=kernel)
        out.backward(torch.ones_like(out))
        exact_out, exact_grads = _fp64_reference(x, *weights, counts, torch.ones(rows, D))
        _assert_bf16_close(out, exact_out)
        for got, exact in zip([x.grad] + [w.grad for w in weights], exact_grads):
            _assert_bf16_close(got, exact)


def test_grouped_mm_padding_for_aligned_token_groups_is_exact(monkeypatch):
    rows = int(COUNTS.sum())
    x = torch.randn(rows, D, dtype=torch.bfloat16)
    weights = [(torch.randn(*shape) * 0.2).bfloat16() for shape in ((E, F, D), (E, D, F), (E, F, D))]
    grad = torch.randn(rows, D, dtype=torch.bfloat16)
    op = select_kernel("grouped_mm", "cpu").op
    backward = KERNELS["grouped_mm"].backward_op

    unpadded = op(x, *weights, COUNTS)
    unpadded_grads = backward(grad, x, *weights, COUNTS, unpadded[1], unpadded[2], unpadded[0])
    # Pretend the CPU needs Neuron's aligned group offsets (16 rows here, 128 on Neuron).
    monkeypatch.setitem(moe_module.GROUPED_MM_TOKEN_ALIGNMENT, "cpu", 16)
    padded = op(x, *weights, COUNTS)
    padded_grads = backward(grad, x, *weights, COUNTS, padded[1], padded[2], padded[0])

    for a, b in zip(padded, unpadded):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    for a, b in zip(padded_grads, unpadded_grads):
        torch.testing.assert_close(a.float(), b.float(), rtol=1e-2, atol=1e-2)


def test_grouped_mm_pads_token_groups_exactly_where_the_device_or_onednn_needs_it(monkeypatch):
    # bf16 on a CPU with native bf16 matmuls goes through oneDNN, whose per-shape kernels make
    # padding pay; without native units (and in fp32) the groups stay exact.
    onednn = torch.ops.mkldnn._is_mkldnn_bf16_supported()
    assert moe_module.grouped_mm_token_alignment(torch.zeros(1, dtype=torch.bfloat16)) == (16 if onednn else 1)
    assert moe_module.grouped_mm_token_alignment(torch.zeros(1)) == 1
    monkeypatch.setitem(moe_module.GROUPED_MM_TOKEN_ALIGNMENT, "cpu", 128)
    assert moe_module.grouped_mm_token_alignment(torch.zeros(1, dtype=torch.bfloat16)) == 128


def test_padded_token_groups_hold_only_the_blocks_the_routing_needs_unless_the_device_needs_static_sizes():
    rows = int(COUNTS.sum())  # [5, 0, 9, 3, 0, 7]: one 16-row block per non-empty expert
    exact = moe_module.TokenGroups(COUNTS, rows, 16, static_size=False)
    assert exact.offsets.tolist() == [16, 16, 32, 48, 48, 64]
    static = moe_module.TokenGroups(COUNTS, rows, 16, static_size=True)
    # The static bound (Neuron's compiled graphs) gives the unused blocks to the last expert.
    assert static.offsets.tolist()[:-1] == [16, 16, 32, 48, 48] and static.offsets[-1] > 64
    x = torch.randn(rows, D)
    assert exact.pad(x).shape[0] == 64
    torch.testing.assert_close(exact.unpad(exact.pad(x)), x, rtol=0, atol=0)


def test_padded_bmm_rejects_counts_that_do_not_cover_the_rows():
    x = torch.randn(int(COUNTS.sum()) + 1, D)
    weights = [torch.randn(*shape) for shape in ((E, F, D), (E, D, F), (E, F, D))]
    with pytest.raises(ValueError, match="sums to 24, but x has 25 rows"):
        moe_swiglu_experts(x, *weights, COUNTS, kernel="padded_bmm")


def _fp32_inputs(counts, seed=2):
    generator = torch.Generator().manual_seed(seed)
    rows = int(counts.sum())
    x = torch.randn(rows, D, generator=generator).requires_grad_()
    weights = [(torch.randn(*shape, generator=generator) * 0.2).requires_grad_() for shape in ((E, F, D), (E, D, F), (E, F, D))]
    return x, weights, torch.randn(rows, D, generator=generator)


def _assert_fp32_close(actual, expected):
    torch.testing.assert_close(actual.double(), expected, rtol=0, atol=2e-5 * expected.abs().max().item())


@pytest.mark.parametrize("kernel", PORTABLE)
def test_kernel_experts_in_fp32_compute_in_fp32(kernel):
    """fp32 parameters and activations: no bf16 round trip, the result is the fp32 math."""
    module = KernelGroupedExperts.Config(dim=D, hidden_dim=F, num_experts=E, kernel=kernel).build()
    module.load_state_dict(_torchtitan_experts().state_dict())
    rows = int(COUNTS.sum())
    x, grad = torch.randn(rows, D), torch.randn(rows, D)
    out, grads = _run(module, x, COUNTS, grad)
    exact_out, exact_grads = _fp64_reference(x, module.w1_EFD, module.w2_EDF, module.w3_EFD, COUNTS, grad)
    _assert_fp32_close(out, exact_out)
    for got, exact in zip(grads, exact_grads):
        assert got.dtype == torch.float32
        _assert_fp32_close(got, exact)


def _padding_cost(counts, capacity):
    from qwen3_trn.kernels.moe_padded import BATCHED_PASS_ROWS, GROUP_LAUNCH_ROWS

    beyond = [count - capacity for count in counts if count > capacity]
    batched = len(counts) * (capacity + BATCHED_PASS_ROWS) if capacity else 0
    return batched + sum(beyond) + GROUP_LAUNCH_ROWS * len(beyond)


def test_padded_capacity_minimises_padding_plus_per_expert_launches():
    from qwen3_trn.kernels.moe_padded import padded_capacity

    generator = torch.Generator().manual_seed(0)
    choices = torch.tensor([0, 1, 2, 5, 40, 64, 80, 100, 500])
    for _ in range(200):
        size = int(torch.randint(1, 12, (1,), generator=generator))
        counts = choices[torch.randint(len(choices), (size,), generator=generator)].tolist()
        best = min(_padding_cost(counts, c) for c in range(max(counts) + 1))
        assert _padding_cost(counts, padded_capacity(counts)) == best, counts
    assert padded_capacity([64] * 64) == 64  # balanced: everything padded, nothing per expert
    assert padded_capacity([512] * 8 + [0] * 56) == 0  # collapsed: only per-expert matmuls
    assert padded_capacity([510] * 7 + [41, 15, 2, 1] + [0] * 53) == 0  # no batched pass for a few rows


@pytest.mark.parametrize("counts", [[3, 0, 40, 2, 0, 5], [4, 4, 4, 4, 4, 4], [0, 0, 24, 0, 0, 0], [6, 0, 9, 1, 0, 30]])
def test_padded_bmm_is_exact_with_and_without_rows_beyond_capacity(counts):
    from qwen3_trn.kernels.moe_padded import PaddedExpertRows

    counts = torch.tensor(counts)
    layout = PaddedExpertRows.of(counts, int(counts.sum()))
    starts = (torch.cumsum(counts, 0) - counts).tolist()
    assert layout.overflow == tuple(
        (e, starts[e] + layout.capacity, starts[e] + n) for e, n in enumerate(counts.tolist()) if n > layout.capacity
    )
    x, weights, grad = _fp32_inputs(counts)
    out = moe_swiglu_experts(x, *weights, counts, kernel="padded_bmm")
    out.backward(grad)
    exact_out, exact_grads = _fp64_reference(x, *weights, counts, grad)
    _assert_fp32_close(out, exact_out)
    for got, exact in zip([x.grad] + [w.grad for w in weights], exact_grads):
        _assert_fp32_close(got, exact)
    empty = (counts == 0).nonzero().flatten()
    for weight in weights:
        assert torch.count_nonzero(weight.grad[empty]) == 0


def test_emulated_bf16_matmuls_run_once_in_fp32_and_round_at_the_end(monkeypatch):
    """On CPUs without native bf16 matmul the inputs are upcast once: the result is exactly
    the fp32 kernel's, rounded to bf16."""
    x, weights, grad = _fp32_inputs(COUNTS)
    x16, w16, grad16 = x.detach().bfloat16(), [w.detach().bfloat16() for w in weights], grad.bfloat16()
    forward, backward = KERNELS["padded_bmm"].op, KERNELS["padded_bmm"].backward_op
    as_fp32 = [t.float() for t in (x16, *w16)]
    want = forward(*as_fp32, COUNTS)
    out16, gate16, up16 = (t.bfloat16() for t in want)  # what the bf16 forward saves
    want_grads = backward(grad16.float(), *as_fp32, COUNTS, gate16.float(), up16.float(), out16.float())

    monkeypatch.setattr(moe_module, "matmul_dtype", lambda t: torch.float32)
    got = forward(x16, *w16, COUNTS)
    got_grads = backward(grad16, x16, *w16, COUNTS, gate16, up16, out16)
    for a, b in zip(got, want):
        assert a.dtype == torch.bfloat16 and torch.equal(a, b.bfloat16())
    for a, b in zip(got_grads, want_grads):
        assert a.dtype == torch.bfloat16 and torch.equal(a, b.bfloat16())


def test_wrapper_rejects_mismatched_shapes_and_dtypes():
    x = torch.randn(int(COUNTS.sum()), D)
    w1, w2, w3 = torch.randn(E, F, D), torch.randn(E, D, F), torch.randn(E, F, D)
    with pytest.raises(ValueError, match=r"w2 \[E, D, F\]"):
        moe_swiglu_experts(x, w1, w1, w3, COUNTS)
    with pytest.raises(ValueError, match="share a dtype"):
        moe_swiglu_experts(x.bfloat16(), w1, w2, w3, COUNTS)
    with pytest.raises(ValueError, match="integer tensor"):
        moe_swiglu_experts(x, w1, w2, w3, COUNTS.float())


@pytest.mark.parametrize("kernel", PORTABLE)
def test_opcheck_schema_fake_and_autograd_registration(kernel):
    op = select_kernel(kernel, "cpu").op
    x = torch.randn(int(COUNTS.sum()), D, requires_grad=True)
    weights = [torch.randn(*shape, requires_grad=True) for shape in ((E, F, D), (E, D, F), (E, F, D))]
    torch.library.opcheck(op, (x, *weights, COUNTS), test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))


def test_fake_tensor_shapes_of_forward_and_backward():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(1000, D, dtype=torch.bfloat16)
        w1, w2, w3 = torch.empty(E, F, D), torch.empty(E, D, F), torch.empty(E, F, D)
        w1, w2, w3 = (w.bfloat16() for w in (w1, w2, w3))
        counts = torch.empty(E, dtype=torch.int64)
        for kernel in PORTABLE:
            out, gate, up = KERNELS[kernel].op(x, w1, w2, w3, counts)
            assert (out.shape, gate.shape, up.shape) == ((1000, D), (1000, F), (1000, F))
            assert out.dtype == torch.bfloat16
            grads = KERNELS[kernel].backward_op(out, x, w1, w2, w3, counts, gate, up, out)
            assert [tuple(g.shape) for g in grads] == [(1000, D), (E, F, D), (E, D, F), (E, F, D)]


def test_nki_plumbing_with_reference_kernels_matches_portable_kernel():
    """The NKI impl's layout conversions, with the documented kernel math standing in for NKI."""
    rows = int(COUNTS.sum())
    x = torch.randn(rows, D)
    weights = [torch.randn(*shape) * 0.2 for shape in ((E, F, D), (E, D, F), (E, F, D))]
    grad = torch.randn(rows, D)
    expected = KERNELS["grouped_mm"].op(x, *weights, COUNTS)
    expected_grads = KERNELS["grouped_mm"].backward_op(grad, x, *weights, COUNTS, expected[1], expected[2], expected[0])

    for block_size in (4, 256):
        out, gate, up = nki_moe_forward_with(blockwise_moe_reference, x, *weights, COUNTS, block_size=block_size)
        for got, want in zip((out, gate, up), expected):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        grads = nki_moe_backward_with(blockwise_moe_backward_reference, grad, x, *weights, COUNTS, gate, up, out, block_size=block_size)
        for got, want in zip(grads, expected_grads):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
