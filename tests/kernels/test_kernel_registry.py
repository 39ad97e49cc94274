"""Selection rules of the expert kernel registry: auto / portable / <name>, per device."""

from __future__ import annotations

import sys

import pytest
import torch

from qwen3_trn.kernels import (
    DEVICE_KERNELS,
    KERNELS,
    ExpertKernel,
    KernelUnavailableError,
    register_kernel,
    resolved_kernel_name,
    select_kernel,
)
from qwen3_trn.kernels.moe import GROUPED_MM, moe_problem


@pytest.fixture
def vendor_kernel_on_cpu(monkeypatch):
    """A kernel that needs a vendor library, first in auto's order on CPU; its probe fails and
    counts how often it runs."""
    probe_calls = {"vendor": 0}

    def vendor_probe():
        probe_calls["vendor"] += 1
        return "import fancy_vendor failed (ModuleNotFoundError). Install fancy_vendor."

    kernel = ExpertKernel("vendor", GROUPED_MM.forward, GROUPED_MM.backward, probe=vendor_probe)
    monkeypatch.setitem(KERNELS, "vendor", kernel)
    monkeypatch.setitem(DEVICE_KERNELS, "cpu", ("vendor", *DEVICE_KERNELS["cpu"]))
    return kernel, probe_calls


def test_auto_prefers_available_vendor_kernel_then_fastest_portable(monkeypatch, vendor_kernel_on_cpu):
    kernel, probe_calls = vendor_kernel_on_cpu
    assert not kernel.portable and GROUPED_MM.portable
    assert select_kernel("auto", "cpu").name == "grouped_mm"
    assert select_kernel("auto", "cuda").name == "grouped_mm"
    assert select_kernel("portable", "cpu").name == "grouped_mm"
    select_kernel("auto", "cpu")
    assert probe_calls["vendor"] == 1, "probes are memoized"

    monkeypatch.setattr(kernel, "probe", lambda: None)
    assert select_kernel("auto", "cpu").name == "vendor"
    assert select_kernel("portable", "cpu").name == "grouped_mm"


def test_explicit_requests_never_fall_back(vendor_kernel_on_cpu):
    assert select_kernel("padded_bmm", "cpu").name == "padded_bmm"
    with pytest.raises(KernelUnavailableError, match=r"import fancy_vendor failed.*Install fancy_vendor"):
        select_kernel("vendor", "cpu")
    with pytest.raises(KernelUnavailableError, match=r"runs on \['cpu', 'cuda'\], not on 'neuron'"):
        select_kernel("padded_bmm", "neuron")
    with pytest.raises(ValueError, match=r"unknown kernel 'nope'.*\['auto', 'portable', 'grouped_mm', 'nki', 'padded_bmm', 'vendor'\]"):
        select_kernel("nope", "cpu")
    with pytest.raises(KernelUnavailableError, match=r"no portable kernel .* on 'xpu' \(no kernel is registered for this device\)"):
        select_kernel("portable", "xpu")


def test_every_device_lists_registered_kernels_and_keeps_its_portable_default():
    assert DEVICE_KERNELS == {"neuron": ("grouped_mm", "nki"), "cpu": ("grouped_mm", "padded_bmm"), "cuda": ("grouped_mm", "padded_bmm")}
    assert {name for names in DEVICE_KERNELS.values() for name in names} == set(KERNELS)
    assert {device: select_kernel("portable", device).name for device in DEVICE_KERNELS} == dict.fromkeys(DEVICE_KERNELS, "grouped_mm")


def test_registration_errors():
    with pytest.raises(ValueError, match="already has a kernel named 'grouped_mm'"):
        register_kernel(ExpertKernel("grouped_mm", GROUPED_MM.forward, GROUPED_MM.backward))
    with pytest.raises(ValueError, match="selection policy"):
        ExpertKernel("auto", GROUPED_MM.forward, GROUPED_MM.backward)
    with pytest.raises(ValueError, match="must be a Python identifier"):
        ExpertKernel("my-kernel", GROUPED_MM.forward, GROUPED_MM.backward)


def test_each_kernel_is_its_own_torch_op_with_the_shared_autograd():
    backward_calls = []

    def backward(*args):
        backward_calls.append(len(args))
        return GROUPED_MM.backward(*args)

    kernel = ExpertKernel("registry_test_kernel", GROUPED_MM.forward, backward)
    assert not hasattr(torch.ops.qwen3_trn, "moe_swiglu_experts__registry_test_kernel"), "ops are created on first use"
    assert kernel.op is torch.ops.qwen3_trn.moe_swiglu_experts__registry_test_kernel.default
    # the paired backward op of the same kernel exists as soon as the forward does
    assert kernel.backward_op is torch.ops.qwen3_trn.moe_swiglu_experts_backward__registry_test_kernel.default
    counts = torch.tensor([2, 0, 3])
    x = torch.randn(5, 8, requires_grad=True)
    weights = [torch.randn(*shape) for shape in ((3, 16, 8), (3, 8, 16), (3, 16, 8))]
    out = kernel.op(x, *weights, counts)[0]
    out.backward(torch.ones_like(out))
    assert backward_calls == [9], "the autograd formula calls this kernel's backward"
    want, gate, up = GROUPED_MM.op(x.detach(), *weights, counts)
    want_grad = GROUPED_MM.backward_op(torch.ones_like(want), x.detach(), *weights, counts, gate, up, want)[0]
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    torch.testing.assert_close(x.grad, want_grad, rtol=0, atol=0)


def _nki_impl():
    return KERNELS["nki"]


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
    if _nki_impl().unavailable_reason() is None:
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


def test_nki_selected_by_name_when_its_imports_succeed_and_auto_keeps_grouped_mm(monkeypatch):
    # The availability probe is the honest seam: NKI cannot run on this machine. auto follows
    # AWS's Neuron 2.34 measurement (torch._grouped_mm above the blockwise NKI kernels).
    monkeypatch.setattr(_nki_impl(), "probe", lambda: None)
    modules_before = set(sys.modules)
    assert resolved_kernel_name("auto", "neuron", **SUPPORTED) == "grouped_mm"
    assert resolved_kernel_name("nki", "neuron", **SUPPORTED) == "nki"
    assert resolved_kernel_name("portable", "neuron", **SUPPORTED) == "grouped_mm"
    assert not any(name.startswith(("torch_neuronx", "nkilib")) for name in set(sys.modules) - modules_before)


def test_nki_shape_constraints_fail_explicit_requests(monkeypatch):
    monkeypatch.setattr(_nki_impl(), "probe", lambda: None)
    with pytest.raises(KernelUnavailableError, match=r"dim \(H\) = 256 must be a multiple of 512"):
        resolved_kernel_name("nki", "neuron", **TOO_NARROW)
