"""MoE token groups reach ``aten::_grouped_mm`` aligned the way Neuron's implementation needs,
in backend=native and backend=hf_v5 (backend=nki_moe aligns in its own kernels).

The stand-in follows torch-neuronx's ``aten::_grouped_mm`` (aws-neuron's torch-neuronx source,
public mirror parmoham-aws/test-repo-parmoham, ``torch_neuronx/python_ops/grouped_mm.py``):
``GroupedMMNKIImpl`` handles 2D x 2D (a [d1, t], b [t, d2]: the weight gradient) and
``GroupedMMMLIRImpl`` 2D x 3D (a [t, d1], b [g, d1, d2]: forward and input gradient); both call
``validate_offs(offs, t, 128)``, which raises ``ValueError`` unless t % 128 == 0, 0 <= offs <= t,
offs % 128 == 0 and offs sorted. No implementation there takes other shapes.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torchtitan.models.common.moe import GroupedExperts

from qwen3_trn.backends.aligned_experts import AlignedGroupedExperts, token_group_alignment
from qwen3_trn.backends.hf_v5 import SDPA_ATTENTION, HfV5Backend
from qwen3_trn.config.typed import to_run_config
from qwen3_trn.devices import planned_device
from qwen3_trn.kernels import moe as moe_kernels
from tests.commands import command_in_process
from tests.conftest import assert_trained, compose_config


def validate_offs(offs: torch.Tensor, t: int, align: int) -> None:
    """torch_neuronx/python_ops/grouped_mm.py's ``validate_offs``."""
    if t % align != 0:
        raise ValueError(f"t must be divisible by {align}")
    if (offs < 0).any() or (offs > t).any():
        raise ValueError(f"offs must be between 0 and {t}")
    if (offs % align != 0).any():
        raise ValueError(f"offs must be divisible by {align}")
    if len(offs) > 1 and (offs[1:] < offs[:-1]).any():
        raise ValueError("offs must be sorted")


class NeuronGroupedMM(TorchDispatchMode):
    """Every ``aten::_grouped_mm`` under this mode goes through Neuron's checks first, then the
    real CPU kernel; ``seen`` counts the (a.dim(), b.dim()) forms checked."""

    def __init__(self, align: int) -> None:
        super().__init__()
        self.align = align
        self.seen: dict[tuple[int, int], int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten._grouped_mm.default:
            a, b = args[0], args[1]
            offs = kwargs["offs"] if "offs" in kwargs else args[2]
            form = (a.dim(), b.dim())
            if form == (2, 2):
                validate_offs(offs, a.shape[1], self.align)
            elif form == (2, 3):
                validate_offs(offs, a.shape[0], self.align)
            else:
                raise NotImplementedError(f"no Neuron implementation of aten::_grouped_mm for {form}")
            self.seen[form] = self.seen.get(form, 0) + 1
        return func(*args, **kwargs)


NEURON_ALIGNMENT = token_group_alignment("neuron")


def test_the_alignment_set_for_neuron_is_the_one_its_grouped_mm_checks():
    assert NEURON_ALIGNMENT == 128


def test_aligned_experts_compute_what_torchtitans_experts_compute():
    torch.manual_seed(0)
    config = GroupedExperts.Config(dim=64, hidden_dim=32, num_experts=4)
    plain = GroupedExperts(config)
    aligned = AlignedGroupedExperts(
        AlignedGroupedExperts.Config(dim=64, hidden_dim=32, num_experts=4, token_group_alignment=NEURON_ALIGNMENT)
    )
    for module in (plain, aligned):
        for name in ("w1_EFD", "w2_EDF", "w3_EFD"):
            torch.manual_seed(hash(name) % 1000)
            torch.nn.init.normal_(getattr(module, name), std=0.1)
    counts = torch.tensor([5, 0, 130, 17])
    x = torch.randn(int(counts.sum()), 64)
    outputs, grads = [], []
    for module in (plain, aligned):
        x_ = x.clone().requires_grad_()
        out = module(x_, counts)
        out.square().sum().backward()
        outputs.append(out)
        grads.append([x_.grad, module.w1_EFD.grad, module.w2_EDF.grad, module.w3_EFD.grad])
    torch.testing.assert_close(outputs[1], outputs[0])
    for got, want in zip(grads[1], grads[0]):
        torch.testing.assert_close(got, want)
    with NeuronGroupedMM(NEURON_ALIGNMENT) as neuron:
        aligned(x.clone().requires_grad_(), counts).sum().backward()
    assert neuron.seen.get((2, 3)) and neuron.seen.get((2, 2))
    with pytest.raises(ValueError, match="divisible by 128"), NeuronGroupedMM(NEURON_ALIGNMENT):
        plain(x, counts)


@pytest.mark.parametrize("backend", ["native", "hf_v5"])
def test_moe_training_step_passes_neurons_grouped_mm_checks(backend, tmp_path, monkeypatch):
    """One training step of model=tiny_moe in each mode, built with the token-group alignment the
    project sets for Neuron (here applied to the CPU the step runs on), forward and backward
    under the stand-in."""
    monkeypatch.setitem(moe_kernels.GROUPED_MM_TOKEN_ALIGNMENT, "cpu", NEURON_ALIGNMENT)
    run_dir = tmp_path / "run"
    args = [f"backend={backend}", "model=tiny_moe", "logger=none", "validation.enable=false", "training.steps=1", "training.seq_len=64"]
    with NeuronGroupedMM(NEURON_ALIGNMENT) as neuron:
        result = command_in_process([*args, "optimizer.warmup_steps=1"], run_dir)
    assert_trained(result, run_dir, steps=1)
    assert neuron.seen.get((2, 3)) and neuron.seen.get((2, 2)), neuron.seen


@pytest.mark.parametrize("backend", ["native", "hf_v5"])
def test_plan_for_trainium_says_how_moe_token_groups_are_aligned(backend, run_dir):
    args = ["mode=plan", "device=neuron", f"backend={backend}", "model=30B-A3B", "model.n_layers=2", "launcher.nproc_per_node=64"]
    result = command_in_process([*args, "parallelism=auto", "logger=none"], run_dir)
    assert result.returncode == 0, result.stderr[-3000:]
    backend_section = result.stdout.split("== Backend ==")[1].split("==")[0]
    assert "moe_token_groups: each expert's rows padded to a multiple of 128" in backend_section
    if backend == "hf_v5":  # FlexAttention's masks are compiled by inductor, which has no Neuron code generation
        assert "hf_attention: qwen3_trn_causal_sdpa" in backend_section


def test_hf_v5_on_neuron_builds_hf_attention_on_sdpa(tmp_path):
    cfg = to_run_config(compose_config(["backend=hf_v5", "model=tiny_moe", "device=neuron"], tmp_path))
    backend = HfV5Backend(cfg.backend)
    spec = backend.model_spec(cfg, backend.architecture(cfg), planned_device("neuron"))
    assert spec.model._attn_implementation == SDPA_ATTENTION
