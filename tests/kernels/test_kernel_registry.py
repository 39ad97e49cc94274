"""Selection rules of the kernel registry, on a private registry and on the project's MoE op."""

from __future__ import annotations

import sys

import pytest
import torch

from qwen3_trn.kernels import (
    KERNELS,
    KernelRegistry,
    KernelUnavailableError,
    OpDeclaration,
    resolve_op,
    resolved_kernel_name,
)
from qwen3_trn.kernels.moe import moe_problem


def _scale_registry(namespace: str) -> tuple[KernelRegistry, dict[str, int]]:
    """A toy op `scale(x) = k * x` with three kernels; counts how often each probe runs."""
    registry = KernelRegistry(namespace=namespace)
    probe_calls = {"vendor": 0}

    def setup_context(ctx, inputs, output):
        pass

    def backward(ctx, grad, *, backward_kernel):
        return backward_kernel(grad)

    registry.declare_op(
        OpDeclaration(
            name="scale",
            schema="(Tensor x) -> Tensor",
            fake=torch.empty_like,
            setup_context=setup_context,
            backward=backward,
            backward_op="scale_backward",
        )
    )
    registry.declare_op(OpDeclaration(name="scale_backward", schema="(Tensor g) -> Tensor", fake=torch.empty_like))

    def vendor_probe():
        probe_calls["vendor"] += 1
        return "import fancy_vendor failed (ModuleNotFoundError). Install fancy_vendor."

    for op_name, factor in (("scale", 2.0), ("scale_backward", 2.0)):
        registry.register_kernel(op_name, "slow", devices=("cpu", "cuda"), priority=1)(lambda x, f=factor: x * f)
        registry.register_kernel(op_name, "fast", devices=("cpu",), priority={"cpu": 5, "*": 0})(lambda x, f=factor: x.mul(f))
        registry.register_kernel(op_name, "vendor", devices=("cpu", "neuron"), available=vendor_probe, priority=100, portable=False)(
            lambda x, f=factor: x * f
        )
    return registry, probe_calls


def test_auto_prefers_available_vendor_kernel_then_fastest_portable(monkeypatch):
    registry, probe_calls = _scale_registry("qwen3_trn_test_auto")
    assert registry.select_kernel("scale", "auto", "cpu").impl_name == "fast"
    assert registry.select_kernel("scale", "auto", "cuda").impl_name == "slow"
    assert registry.select_kernel("scale", "portable", "cpu").impl_name == "fast"
    registry.select_kernel("scale", "auto", "cpu")
    assert probe_calls["vendor"] == 1, "probes are memoized"

    monkeypatch.setattr(registry.impl("scale", "vendor"), "probe", lambda: None)
    assert registry.select_kernel("scale", "auto", "cpu").impl_name == "vendor"
    assert registry.select_kernel("scale", "portable", "cpu").impl_name == "fast"


def test_explicit_requests_never_fall_back():
    registry, _ = _scale_registry("qwen3_trn_test_explicit")
    assert registry.select_kernel("scale", "slow", "cpu").impl_name == "slow"
    with pytest.raises(KernelUnavailableError, match=r"import fancy_vendor failed.*Install fancy_vendor"):
        registry.select_kernel("scale", "vendor", "cpu")
    with pytest.raises(KernelUnavailableError, match=r"runs on \['cpu'\], not on 'cuda'"):
        registry.select_kernel("scale", "fast", "cuda")
    with pytest.raises(ValueError, match=r"unknown kernel 'nope'.*\['auto', 'portable', 'fast', 'slow', 'vendor'\]"):
        registry.select_kernel("scale", "nope", "cpu")
    with pytest.raises(KernelUnavailableError, match="no portable kernel"):
        registry.select_kernel("scale", "portable", "neuron")
    with pytest.raises(ValueError, match="unknown op"):
        registry.select_kernel("nope", "auto", "cpu")


def test_registration_errors():
    registry, _ = _scale_registry("qwen3_trn_test_registration")
    with pytest.raises(ValueError, match="already has a kernel named 'fast'"):
        registry.register_kernel("scale", "fast", devices=("cpu",))(lambda x: x)
    with pytest.raises(ValueError, match="selection policy"):
        registry.register_kernel("scale", "auto", devices=("cpu",))
    with pytest.raises(ValueError, match="already declared"):
        registry.declare_op(OpDeclaration(name="scale", schema="(Tensor x) -> Tensor", fake=torch.empty_like))
    with pytest.raises(ValueError, match="backward_op"):
        OpDeclaration(
            name="x", schema="(Tensor x) -> Tensor", fake=torch.empty_like, setup_context=lambda *a: None, backward=lambda *a: None
        )


def test_each_kernel_is_its_own_torch_op_with_the_shared_autograd():
    registry, _ = _scale_registry("qwen3_trn_test_ops")
    choice = registry.select_kernel("scale", "fast", "cpu")
    assert not hasattr(torch.ops.qwen3_trn_test_ops, "scale__slow"), "ops are created on first use"
    assert choice.op is torch.ops.qwen3_trn_test_ops.scale__fast.default
    # the paired backward op of the same kernel exists as soon as the forward does
    assert hasattr(torch.ops.qwen3_trn_test_ops, "scale_backward__fast")
    assert not hasattr(torch.ops.qwen3_trn_test_ops, "scale_backward__slow")
    x = torch.arange(3.0, requires_grad=True)
    choice(x).sum().backward()
    assert torch.equal(x.grad, torch.full((3,), 2.0))


def _nki_impl():
    return KERNELS.impl("moe_swiglu_experts", "nki")


SUPPORTED = moe_problem(dim=1024, hidden_dim=768, num_experts=64)
TOO_NARROW = moe_problem(dim=256, hidden_dim=768, num_experts=64)  # debugmodel_moe: dim < 512


def test_moe_auto_on_cpu_and_cuda_picks_the_fastest_portable_kernel():
    assert resolved_kernel_name("auto", "cpu") == "grouped_mm"
    assert resolved_kernel_name("portable", "cpu") == "grouped_mm"
    assert resolved_kernel_name("auto", "cuda") == "grouped_mm"
    assert resolved_kernel_name("padded_bmm", "cpu") == "padded_bmm"
    # grouped_mm needs 16-byte aligned strides: the next portable kernel runs widths it cannot
    assert resolved_kernel_name("auto", "cpu", dim=60, hidden_dim=96, num_experts=4) == "padded_bmm"


def test_nki_requested_where_it_cannot_import_raises_with_the_failed_import_and_fix():
    if _nki_impl().is_available():
        pytest.skip("the Neuron stack is installed here")
    with pytest.raises(KernelUnavailableError) as error:
        resolved_kernel_name("nki", "neuron")
    message = str(error.value)
    assert "torch_neuronx.nki_op cannot be used (ModuleNotFoundError" in message
    assert "torch-neuronx" in message and "nki-library" in message and "kernels=portable" in message
    assert isinstance(error.value, ValueError)
    # auto on a Neuron device without the NKI stack uses the portable grouped_mm
    assert resolved_kernel_name("auto", "neuron") == "grouped_mm"


def test_nki_is_never_selected_off_neuron_devices(monkeypatch):
    monkeypatch.setattr(_nki_impl(), "probe", lambda: None)
    with pytest.raises(KernelUnavailableError, match=r"runs on \['neuron'\], not on 'cpu'"):
        resolved_kernel_name("nki", "cpu")
    assert resolved_kernel_name("auto", "cpu") == "grouped_mm"


def test_nki_selected_when_its_imports_succeed(monkeypatch):
    # The availability probe is the honest seam: NKI cannot run on this machine.
    monkeypatch.setattr(_nki_impl(), "probe", lambda: None)
    modules_before = set(sys.modules)
    assert resolved_kernel_name("auto", "neuron", **SUPPORTED) == "nki"
    assert resolved_kernel_name("nki", "neuron", **SUPPORTED) == "nki"
    assert resolved_kernel_name("portable", "neuron", **SUPPORTED) == "grouped_mm"
    assert not any(name.startswith(("torch_neuronx", "nkilib")) for name in set(sys.modules) - modules_before)


def test_nki_shape_constraints_steer_auto_and_fail_explicit_requests(monkeypatch):
    monkeypatch.setattr(_nki_impl(), "probe", lambda: None)
    assert resolved_kernel_name("auto", "neuron", **TOO_NARROW) == "grouped_mm"
    with pytest.raises(KernelUnavailableError, match=r"dim \(H\) = 256 must be a multiple of 512"):
        resolved_kernel_name("nki", "neuron", **TOO_NARROW)


# ----------------------------------------------------------------------------- adding an operator
def _half_split_permutation(size: int) -> torch.Tensor:
    return torch.cat([torch.arange(0, size, 2), torch.arange(1, size, 2)])


def _declare_rope_layout_ops(registry: KernelRegistry) -> None:
    """An operator added the documented way: one declaration per op, one kernel registration.

    ``interleaved_to_half_split`` reorders the last axis from RoPE pairs (x0, x1), (x2, x3), ...
    to halves (x0, x2, ..., x1, x3, ...); its gradient is the inverse permutation, the paired op.
    """

    def setup_context(ctx, inputs, output):
        pass

    def backward(ctx, grad, *, backward_kernel):
        return backward_kernel(grad)

    for name, inverse in (
        ("interleaved_to_half_split", "half_split_to_interleaved"),
        ("half_split_to_interleaved", "interleaved_to_half_split"),
    ):
        registry.declare_op(
            OpDeclaration(
                name=name,
                schema="(Tensor x) -> Tensor",
                fake=torch.empty_like,
                setup_context=setup_context,
                backward=backward,
                backward_op=inverse,
            )
        )
    registry.register_kernel("interleaved_to_half_split", "index_select", devices=("cpu",))(
        lambda x: x.index_select(-1, _half_split_permutation(x.shape[-1]))
    )
    registry.register_kernel("half_split_to_interleaved", "index_select", devices=("cpu",))(
        lambda x: x.index_select(-1, torch.argsort(_half_split_permutation(x.shape[-1])))
    )


def test_adding_an_operator_is_one_declaration_and_one_registration():
    registry = KernelRegistry(namespace="qwen3_trn_test_new_op")
    _declare_rope_layout_ops(registry)

    def to_half_split(x):
        return resolve_op("interleaved_to_half_split", "auto", x.device.type, registry=registry)(x)

    assert to_half_split(torch.arange(8.0)).tolist() == [0, 2, 4, 6, 1, 3, 5, 7]
    # autograd comes from the declaration: the gradient is the inverse permutation
    x = torch.randn(3, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(to_half_split, (x,))
    op = registry.select_kernel("interleaved_to_half_split", "auto", "cpu").op
    assert op is torch.ops.qwen3_trn_test_new_op.interleaved_to_half_split__index_select.default
    torch.library.opcheck(
        op, (torch.randn(3, 8, requires_grad=True),), test_utils=("test_schema", "test_faketensor", "test_autograd_registration")
    )
    # and it compiles as one opaque node, selection resolved at trace time
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: to_half_split(t) * 2, backend="aot_eager", fullgraph=True)
    y = torch.randn(2, 6, requires_grad=True)
    compiled(y).sum().backward()
    torch.testing.assert_close(compiled(y), to_half_split(y) * 2)
    assert torch.equal(y.grad, torch.full_like(y, 2.0))
