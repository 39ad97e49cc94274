"""Architecture overrides reach every place torchtitan stores them, proven on built models."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from torchtitan.models.qwen3 import model_registry

from qwen3_trn.app import to_run_config
from qwen3_trn.common.errors import ConfigError
from qwen3_trn.config.schema import ModelConfig
from qwen3_trn.models.architecture import FIELDS, FLAVORS, Qwen3Architecture
from qwen3_trn.models.hf_config import architecture_from_hf, hf_config_dict
from qwen3_trn.run.preflight import prepare
from tests.conftest import compose_config


def _prepared(overrides, tmp_path):
    return prepare(to_run_config(compose_config(["mode=plan", *overrides], tmp_path)))


def _spec(overrides, tmp_path):
    return _prepared(overrides, tmp_path).trainer_config.model_spec


def _build_on_meta(model_config):
    with torch.device("meta"):
        return model_config.build()


def _shapes(module):
    return {name: tuple(p.shape) for name, p in module.named_parameters()}


@pytest.mark.parametrize("flavor", ["debugmodel", "debugmodel_moe", "0.6B", "30B-A3B"])
def test_no_override_matches_torchtitan_flavor(flavor, tmp_path):
    ours = _build_on_meta(_spec([f"model={flavor}"], tmp_path).model)
    theirs = _build_on_meta(model_registry(flavor).model)
    assert _shapes(ours) == _shapes(theirs)


def test_seed_reduced_moe_builds_with_requested_shape(tmp_path):
    spec = _spec(["model=30B-A3B", "model.n_layers=4", "model.num_experts=64", "model.top_k=4"], tmp_path)
    config = spec.model
    assert len(config.layers) == 4
    for layer in config.layers:
        assert layer.moe.router.top_k == 4
        assert layer.moe.routed_experts.token_dispatcher.top_k == 4
        assert layer.moe.num_experts == 64
        # the residual init of every layer follows n_layers
        std = layer.attention.wo.param_init["weight"].keywords["std"]
        assert math.isclose(std, 0.02 / math.sqrt(2 * 4))
    model = _build_on_meta(config)
    assert len(model.layers) == 4
    shapes = _shapes(model)
    assert shapes["layers.3.moe.routed_experts.inner_experts.w1_EFD"] == (64, 768, 2048)
    assert shapes["layers.0.moe.router.gate.weight"] == (64, 2048)


def test_dense_overrides_reach_the_built_model(tmp_path):
    spec = _spec(
        [
            "model=debugmodel",
            "model.n_layers=3",
            "model.dim=192",
            "model.n_heads=6",
            "model.n_kv_heads=3",
            "model.head_dim=32",
            "model.hidden_dim=320",
            "model.vocab_size=4096",
            "model.max_seq_len=1024",
        ],
        tmp_path,
    )
    model = _build_on_meta(spec.model)
    shapes = _shapes(model)
    assert len(model.layers) == 3
    assert shapes["tok_embeddings.weight"] == (4096, 192)
    assert shapes["layers.2.feed_forward.w1.weight"] == (320, 192)
    qkv = [s for n, s in shapes.items() if n.startswith("layers.0.attention.qkv_linear")]
    assert qkv == [((6 + 2 * 3) * 32, 192)]
    assert shapes["layers.0.attention.wo.weight"] == (192, 6 * 32)
    assert spec.model.layers[0].attention.rope.max_seq_len == 1024


@pytest.mark.parametrize(
    "overrides,key",
    [
        (["model=tiny_moe", "model.top_k=9"], "model.top_k"),
        (["model.n_heads=6", "model.n_kv_heads=4"], "model.n_heads"),
        (["model.top_k=2"], "model.top_k"),
        (["model=tiny_moe", "model.hidden_dim=64"], "model.hidden_dim"),
    ],
)
def test_inconsistent_architecture_is_refused(overrides, key, tmp_path):
    with pytest.raises(ConfigError) as info:
        _spec(overrides, tmp_path)
    assert info.value.key == key


def test_every_architecture_field_is_one_row():
    names = [f.name for f in FIELDS]
    assert [f.name for f in dataclasses.fields(Qwen3Architecture)] == names
    schema = {f.name: f.default for f in dataclasses.fields(ModelConfig)}
    assert all(schema.get(name, "missing") is None for name in names), "every row is a model.<name> override, None by default"


def _parameters(module):
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize(
    "model,tied",
    [("tiny", True), ("tiny_moe", False)],
)
def test_tie_embeddings_override_changes_the_built_model(model, tied, tmp_path):
    """model.tie_embeddings flips the flavor's: one embedding matrix more or less, in the native
    model and in the exported config.json of both modes."""
    kept = _build_on_meta(_spec([f"model={model}"], tmp_path).model)
    prepared = _prepared([f"model={model}", f"model.tie_embeddings={str(not tied).lower()}", "checkpoint=hf_export"], tmp_path)
    flipped = _build_on_meta(prepared.trainer_config.model_spec.model)
    assert (kept.lm_head.weight is kept.tok_embeddings.weight) is tied
    assert (flipped.lm_head.weight is flipped.tok_embeddings.weight) is not tied
    vocab, dim = kept.tok_embeddings.weight.shape
    assert _parameters(flipped) - _parameters(kept) == (vocab * dim if tied else -vocab * dim)
    assert prepared.arch.tie_embeddings is not tied
    assert prepared.trainer_config.checkpoint.hf_config["tie_word_embeddings"] is not tied
    hf_v5 = _prepared(
        ["backend=hf_v5", f"model={model}", f"model.tie_embeddings={str(not tied).lower()}", "checkpoint=hf_export"], tmp_path
    )
    assert hf_v5.trainer_config.checkpoint.hf_config["tie_word_embeddings"] is not tied


def _attention_weights(overrides, tmp_path):
    model = _build_on_meta(_spec(overrides, tmp_path).model)
    return {
        name.removeprefix("layers.0.attention."): shape for name, shape in _shapes(model).items() if name.startswith("layers.0.attention.")
    }


def test_fuse_qkv_preset_and_override_change_the_built_model(tmp_path):
    fused = _attention_weights(["model=debugmodel"], tmp_path)
    separate = _attention_weights(["model=debugmodel_non_fused_qkv"], tmp_path)
    assert any(name.startswith("qkv_linear.wqkv") for name in fused)
    assert {"qkv_linear.wq.weight", "qkv_linear.wk.weight", "qkv_linear.wv.weight"} <= set(separate)
    assert _attention_weights(["model=debugmodel", "model.fuse_qkv=false"], tmp_path) == separate
    assert _attention_weights(["model=debugmodel_non_fused_qkv", "model.fuse_qkv=true"], tmp_path) == fused
    # the preset states what its flavor builds
    assert compose_config(["model=debugmodel_non_fused_qkv"]).model.fuse_qkv is False


@pytest.mark.parametrize("flavor", FLAVORS)
def test_hf_config_round_trip_keeps_every_field(flavor):
    """architecture -> HF config -> architecture -> HF config: every field with an HF key is kept
    (fuse_qkv is native only: HF keeps q/k/v separate either way)."""
    arch = Qwen3Architecture.of_flavor(flavor)
    hf = hf_config_dict(arch)
    back = architecture_from_hf(hf, flavor)
    assert back == dataclasses.replace(arch, fuse_qkv=True)
    assert hf_config_dict(back) == hf
    for field in FIELDS:
        if field.hf and getattr(arch, field.name) is not None:
            assert getattr(back, field.name) == getattr(arch, field.name), field.name


def test_hf_config_round_trip_keeps_a_released_config():
    """A config.json as released (older key spellings, fields the project does not model):
    read and written back, the architecture's keys hold the same numbers and the rest is kept."""
    released = {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "hidden_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_hidden_layers": 3,
        "vocab_size": 1000,
        "max_position_embeddings": 512,
        "rope_theta": 5000.0,
        "tie_word_embeddings": True,
        "num_local_experts": 6,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 64,
        "intermediate_size": 128,
        "bos_token_id": 7,
    }
    arch = architecture_from_hf(released, "released")
    assert (arch.head_dim, arch.num_experts, arch.rope_theta, arch.tie_embeddings) == (64, 6, 5000.0, True)
    written = hf_config_dict(arch, released)
    assert architecture_from_hf(written, "written") == arch
    assert "rope_theta" not in written and written["rope_parameters"]["rope_theta"] == 5000.0
    assert written["tie_word_embeddings"] is True and written["bos_token_id"] == 7
