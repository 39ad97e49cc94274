"""Qwen3 architecture: a torchtitan flavor's numbers, with the user's overrides applied.

torchtitan's ``model_registry(flavor)`` takes no size overrides and stores some values in
several places (``top_k`` in the router and in the experts of every layer, ``n_layers`` in
every layer's residual init), so an override rebuilds the layer configs from these numbers
rather than patching fields one by one.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from qwen3_trn.config.schema import ModelConfig
from qwen3_trn.errors import ConfigError, NotApplicable
from qwen3_trn.titan import MoE, Qwen3Model, qwen3_configs

FLAVORS = tuple(qwen3_configs)
MOE_KEYS = ("num_experts", "top_k", "moe_hidden_dim")
DENSE_KEYS = ("hidden_dim",)


@dataclass(frozen=True)
class Qwen3Architecture:
    n_layers: int
    dim: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab_size: int
    max_seq_len: int
    rope_theta: float
    fuse_qkv: bool
    tie_embeddings: bool
    # dense
    hidden_dim: int | None = None
    # mixture of experts
    num_experts: int | None = None
    top_k: int | None = None
    moe_hidden_dim: int | None = None

    @property
    def is_moe(self) -> bool:
        return self.num_experts is not None

    @classmethod
    def of_flavor(cls, flavor: str) -> "Qwen3Architecture":
        if flavor not in qwen3_configs:
            raise ConfigError("model.flavor", f"unknown Qwen3 flavor '{flavor}'; torchtitan ships {', '.join(FLAVORS)}.")
        return cls.of_model_config(qwen3_configs[flavor](attn_backend="flex"))

    @classmethod
    def of_model_config(cls, config: Qwen3Model.Config) -> "Qwen3Architecture":
        """The numbers of a built torchtitan Qwen3 model config."""
        layer = config.layers[0]
        attention = layer.attention
        common = dict(
            n_layers=len(config.layers),
            dim=config.dim,
            n_heads=attention.n_heads,
            n_kv_heads=attention.n_kv_heads,
            head_dim=attention.head_dim,
            vocab_size=config.vocab_size,
            max_seq_len=attention.rope.max_seq_len,
            rope_theta=attention.rope.theta,
            fuse_qkv=type(attention.qkv_linear).__qualname__.startswith("FusedQKV"),
            tie_embeddings=config.enable_weight_tying,
        )
        moe: MoE.Config | None = getattr(layer, "moe", None)
        if moe is not None:
            return cls(
                **common,
                num_experts=moe.num_experts,
                top_k=moe.router.top_k,
                moe_hidden_dim=moe.routed_experts.inner_experts.hidden_dim,
            )
        return cls(**common, hidden_dim=layer.feed_forward.w1.out_features)

    def requested_overrides(self, model: ModelConfig) -> dict[str, Any]:
        """The model group's non-null architecture keys."""
        return {
            f.name: getattr(model, f.name)
            for f in dataclasses.fields(self)
            if hasattr(model, f.name) and getattr(model, f.name) is not None
        }

    def keys_of_other_kind(self, requested: dict[str, Any]) -> list[str]:
        """Requested keys that apply only to the other kind of model (dense vs MoE)."""
        return [k for k in requested if k in (DENSE_KEYS if self.is_moe else MOE_KEYS)]

    def replaced(self, requested: dict[str, Any]) -> "Qwen3Architecture":
        arch = dataclasses.replace(self, **requested)
        arch.validate()
        return arch

    def with_overrides(self, model: ModelConfig) -> "Qwen3Architecture":
        requested = self.requested_overrides(model)
        wrong_kind = self.keys_of_other_kind(requested)
        if wrong_kind:
            kind, other = (
                ("an MoE", "hidden_dim applies to dense flavors; use model.moe_hidden_dim")
                if self.is_moe
                else (
                    "a dense",
                    "num_experts/top_k/moe_hidden_dim apply to MoE flavors (debugmodel_moe, 30B-A3B, 235B-A22B)",
                )
            )
            raise NotApplicable(f"model.{wrong_kind[0]}", f"model={model.flavor} is {kind} flavor: {other}.")
        return self.replaced(requested)

    def validate(self) -> None:
        for name in ("n_layers", "dim", "n_heads", "n_kv_heads", "head_dim", "vocab_size", "max_seq_len"):
            if getattr(self, name) < 1:
                raise ConfigError(f"model.{name}", f"must be a positive integer, got {getattr(self, name)}.")
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(
                "model.n_heads",
                f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads} "
                "(grouped-query attention shares each KV head among n_heads/n_kv_heads query heads); "
                "choose n_kv_heads that divides n_heads.",
            )
        if self.head_dim % 2:
            raise ConfigError("model.head_dim", f"must be even for rotary embeddings, got {self.head_dim}.")
        if self.is_moe:
            if self.num_experts < 1 or self.top_k < 1:
                raise ConfigError("model.top_k", "num_experts and top_k must be positive integers.")
            if self.top_k > self.num_experts:
                raise ConfigError(
                    "model.top_k",
                    f"top_k={self.top_k} is larger than num_experts={self.num_experts}; "
                    f"each token picks top_k distinct experts, so set model.top_k <= {self.num_experts}.",
                )

    def summary(self) -> dict[str, int | float | bool | None]:
        return dataclasses.asdict(self)
