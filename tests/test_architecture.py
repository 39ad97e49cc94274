"""Architecture overrides reach every place torchtitan stores them, proven on built models."""

from __future__ import annotations

import math

import pytest
import torch
from torchtitan.models.qwen3 import model_registry

from qwen3_trn.app import to_run_config
from qwen3_trn.errors import ConfigError
from qwen3_trn.preflight import prepare
from tests.conftest import compose_config


def _spec(overrides, tmp_path):
    return prepare(to_run_config(compose_config(["mode=plan", *overrides], tmp_path))).trainer_config.model_spec


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
