"""torchtitan Qwen3 model configs and ModelSpecs for an architecture.

Built with torchtitan's private layer builders, the one place it encodes Qwen3's per-layer
structure and init, so that without overrides the layers equal torchtitan's own flavors.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable

from qwen3_trn.models.architecture import LAYERS, MODEL, ROPE, Qwen3Architecture
from qwen3_trn.titan import (
    _EMBEDDING_INIT,
    _EMBEDDING_SKIP_INIT,
    GroupedExperts,
    ModelConfigConverter,
    ModelSpec,
    Module,
    Qwen3Model,
    _build_qwen3_layers,
    _build_qwen3_moe_layers,
    _qwen3_norm,
    attention_mask_type,
    model_registry,
    moe_dispatch_args,
    nested_configs,
    qwen3_configs,
)


def _accepted(builder: Callable, **kwargs: Any) -> dict[str, Any]:
    """The keywords ``builder`` takes (the layer builders gained ``rope`` on 2026-06-05, the MoE one
    ``fuse_qkv`` in 0.3)."""
    params = inspect.signature(builder).parameters
    return {k: v for k, v in kwargs.items() if k in params}


def _layers(arch: Qwen3Architecture, rope: Module.Config) -> list:
    """Every layer's config, from torchtitan's own layer builder for the architecture's kind."""
    if arch.is_moe:
        builder, extra = _build_qwen3_moe_layers, moe_dispatch_args()
    else:
        builder, extra = _build_qwen3_layers, {}
    args = arch.titan_args(LAYERS)
    if "fuse_qkv" not in inspect.signature(builder).parameters:
        args.pop("fuse_qkv", None)
    return builder(**args, attn_backend="flex", **extra, **_accepted(builder, rope=rope))


def _rope_holder(config: Qwen3Model.Config) -> Any:
    """What holds the rope config: every attention layer (2026-06-05 on) or the model before."""
    return config.rope if hasattr(config, "rope") else config.layers[0].attention


def output_projection(config: Qwen3Model.Config) -> str:
    """The output projection's attribute: ``lm_head`` (2026-05 on), ``output`` before."""
    return "lm_head" if hasattr(config, "lm_head") else "output"


def build_model_config(flavor: str, arch: Qwen3Architecture, inner_attention: Module.Config) -> Qwen3Model.Config:
    """The flavor's config with every architecture value set from ``arch``."""
    config: Qwen3Model.Config = qwen3_configs[flavor](attn_backend="flex")
    if hasattr(config, "rope"):  # one rope for the model, before 2026-06-05
        config.rope = dataclasses.replace(config.rope, **arch.titan_args(ROPE))
        config.layers = _layers(arch, None)
    else:
        config.layers = _layers(arch, dataclasses.replace(config.layers[0].attention.rope, **arch.titan_args(ROPE)))
    for name, value in arch.titan_args(MODEL).items():
        setattr(config, name, value)
    # what follows from them: sizes, and a tied embedding is initialised as the output projection
    config.norm = _qwen3_norm(arch.dim)
    embedding_init = _EMBEDDING_SKIP_INIT if arch.tie_embeddings else _EMBEDDING_INIT
    config.tok_embeddings = dataclasses.replace(
        config.tok_embeddings, num_embeddings=arch.vocab_size, embedding_dim=arch.dim, param_init=embedding_init
    )
    head = output_projection(config)
    setattr(config, head, dataclasses.replace(getattr(config, head), in_features=arch.dim, out_features=arch.vocab_size))
    mask_type = attention_mask_type(inner_attention)
    for layer in config.layers:
        layer.attention.inner_attention = dataclasses.replace(inner_attention)
        if mask_type is not None:
            layer.attention.mask_type = mask_type
    return config


def native_model_spec(
    flavor: str,
    arch: Qwen3Architecture,
    inner_attention: Module.Config,
    converters: list[ModelConfigConverter.Config] | None = None,
) -> ModelSpec:
    """torchtitan's Qwen3 ModelSpec (parallelize, pipelining, HF adapter) for ``arch``."""
    spec = model_registry(flavor, attn_backend="flex")
    config = build_model_config(flavor, arch, inner_attention)
    for converter in converters or []:
        config = converter.build().convert(config)
    return dataclasses.replace(spec, model=config)


def replace_grouped_experts(model_config: Module.Config, replace: Callable[[str, GroupedExperts.Config], Module.Config]) -> Module.Config:
    """Replace every ``GroupedExperts.Config`` (subclasses too) in ``model_config`` by
    ``replace(fqn, config)``; returns the (possibly new) root config."""
    for fqn, config, parent, attr in list(nested_configs(model_config, GroupedExperts.Config)):
        new_config = replace(fqn, config)
        if parent is None:
            model_config = new_config
        elif isinstance(parent, list):
            parent[attr] = new_config
        else:
            setattr(parent, attr, new_config)
    return model_config


def init_fields(config: Any) -> dict[str, Any]:
    """A dataclass config's constructor arguments, to rebuild it as a subclass's config."""
    return {field.name: getattr(config, field.name) for field in dataclasses.fields(config) if field.init}
