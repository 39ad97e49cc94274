"""The KernelGroupedExperts swap on torchtitan's Qwen3 MoE config, and torch.compile of the op."""

from __future__ import annotations

import pytest
import torch
from torchtitan.models.common.moe import GroupedExperts
from torchtitan.models.qwen3 import model_registry
from torchtitan.overrides.fused_swiglu import FusedGroupedExperts

from qwen3_trn.kernels import (
    KernelExpertsConverter,
    KernelGroupedExperts,
    moe_swiglu_experts,
    use_kernel_experts,
)


def _expert_configs(model_config):
    return [config for _, config, _, _ in model_config.traverse(GroupedExperts.Config)]


def _shapes(module):
    return {name: tuple(p.shape) for name, p in module.named_parameters()}


def test_converter_replaces_every_grouped_experts_config_through_model_registry():
    original = model_registry("debugmodel_moe", attn_backend="flex").model
    converted = model_registry("debugmodel_moe", attn_backend="flex", converters=[KernelExpertsConverter.Config(kernel="portable")]).model
    before, after = _expert_configs(original), _expert_configs(converted)
    assert len(after) == len(before) == len(converted.layers) == 8
    for old, new in zip(before, after):
        assert type(new) is KernelGroupedExperts.Config and new.kernel == "portable"
        assert (new.dim, new.hidden_dim, new.num_experts) == (old.dim, old.hidden_dim, old.num_experts)
        assert {k: v.keywords for k, v in new.param_init.items()} == {k: v.keywords for k, v in old.param_init.items()}

    with torch.device("meta"):
        theirs, ours = original.build(), converted.build()
    assert _shapes(ours) == _shapes(theirs)
    experts = [m for m in ours.modules() if isinstance(m, GroupedExperts)]
    assert len(experts) == 8 and all(isinstance(m, KernelGroupedExperts) for m in experts)
    assert set(ours.state_dict()) == set(theirs.state_dict())


def test_conversion_carries_every_field_over_unchanged():
    config = model_registry("debugmodel_moe").model
    before = [(c.param_init, c.sharding_config, c.dim) for c in _expert_configs(config)]
    converted = KernelExpertsConverter.Config(kernel="auto").build().convert(config)
    after = [(c.param_init, c.sharding_config, c.dim) for c in _expert_configs(converted)]
    assert all(a[0] is b[0] and a[1] is b[1] and a[2] == b[2] for a, b in zip(after, before))
    assert len(after) == 8


def test_use_kernel_experts_updates_existing_kernel_configs_and_refuses_variants():
    config = use_kernel_experts(model_registry("debugmodel_moe").model, kernel="grouped_mm")
    config = use_kernel_experts(config, kernel="padded_bmm")
    assert {c.kernel for c in _expert_configs(config)} == {"padded_bmm"}

    root = GroupedExperts.Config(dim=8, hidden_dim=8, num_experts=2)
    swapped_root = use_kernel_experts(root, kernel="auto")
    assert type(swapped_root) is KernelGroupedExperts.Config

    with pytest.raises(ValueError, match="unknown kernel 'fastest'"):
        use_kernel_experts(model_registry("debugmodel_moe").model, kernel="fastest")
    fused = FusedGroupedExperts.Config(dim=8, hidden_dim=8, num_experts=2)
    with pytest.raises(ValueError, match="FusedGroupedExperts.Config is a GroupedExperts variant"):
        use_kernel_experts(fused, kernel="auto")
    with pytest.raises(ValueError, match="unknown kernel"):
        KernelGroupedExperts.Config(dim=8, hidden_dim=8, num_experts=2, kernel="typo").build()


@pytest.fixture
def one_thread():
    # Thousands of tiny ops here: on a loaded 2-core machine OpenMP handoffs dominate.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.filterwarnings("ignore:In CPU autocast:UserWarning")  # torchtitan's fp32 router autocast
@pytest.mark.parametrize("kernel", ["auto", "grouped_mm", "padded_bmm"])
def test_swapped_moe_layer_matches_torchtitan_end_to_end(one_thread, kernel):
    """Router, dispatcher, experts and combine of one debugmodel_moe layer, values and grads."""
    layer = model_registry("debugmodel_moe").model.layers[0].moe
    torch.manual_seed(0)
    theirs = layer.build()
    theirs.init_states()
    ours = use_kernel_experts(model_registry("debugmodel_moe").model, kernel=kernel).layers[0].moe.build()
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(1, 16, 256)
    results = []
    for module in (theirs, ours):
        x_ = x.clone().requires_grad_()
        out = module(x_)
        out.backward(torch.ones_like(out))
        results.append((out, x_.grad, {n: p.grad for n, p in module.named_parameters()}))
    (out_a, gx_a, grads_a), (out_b, gx_b, grads_b) = results
    torch.testing.assert_close(out_b, out_a, rtol=0, atol=2e-2 * out_a.abs().max().item())
    torch.testing.assert_close(gx_b, gx_a, rtol=0, atol=2e-2 * gx_a.abs().max().item())
    for name, grad in grads_a.items():
        torch.testing.assert_close(grads_b[name], grad, rtol=0, atol=2e-2 * grad.abs().max().item())


def _tiny_experts(kernel: str) -> KernelGroupedExperts:
    module = KernelGroupedExperts.Config(dim=16, hidden_dim=32, num_experts=4, kernel=kernel).build()
    torch.manual_seed(0)
    with torch.no_grad():
        for param in module.parameters():
            param.normal_(std=0.2)
    return module


def test_compiled_module_fullgraph_aot_eager_matches_eager():
    module = _tiny_experts("auto")
    counts = torch.tensor([5, 0, 7, 4])
    x = torch.randn(16, 16)
    eager = module(x, counts)
    torch._dynamo.reset()
    compiled = torch.compile(module, backend="aot_eager", fullgraph=True)
    x_ = x.clone().requires_grad_()
    out = compiled(x_, counts)
    out.sum().backward()
    torch.testing.assert_close(out, eager, rtol=0, atol=0)
    assert x_.grad is not None and module.w1_EFD.grad[1].abs().max() == 0


def test_compiled_op_call_with_inductor_on_cpu():
    counts = torch.tensor([3, 0, 5])
    weights = [torch.randn(*shape) * 0.2 for shape in ((3, 16, 8), (3, 8, 16), (3, 16, 8))]

    def experts(x, w1, w2, w3):
        return moe_swiglu_experts(x, w1, w2, w3, counts, kernel="grouped_mm").relu()

    x = torch.randn(8, 8, requires_grad=True)
    torch._dynamo.reset()
    compiled = torch.compile(experts, backend="inductor", fullgraph=True)
    out = compiled(x, *weights)
    out.sum().backward()
    torch.testing.assert_close(out, experts(x, *weights))
    assert x.grad.shape == x.shape
