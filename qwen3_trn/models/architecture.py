"""Qwen3 architecture: a torchtitan flavor's numbers with the user's overrides applied.

``FIELDS`` is the one mapping of every architecture number: its ``model.<name>`` override, where
torchtitan's ``Qwen3Model.Config`` holds it, what takes it when that config is rebuilt, and its
HF ``config.json`` key. torchtitan stores some numbers in several places (``top_k`` in the
router and every layer's experts), so an override rebuilds the layer configs rather than patching
fields.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Literal

from qwen3_trn.common.errors import ConfigError, NotApplicable
from qwen3_trn.config.schema import ModelConfig
from qwen3_trn.titan import Qwen3Model, qwen3_configs

FLAVORS = tuple(qwen3_configs)
Kind = Literal["common", "dense", "moe"]
# What takes a number when the model config is rebuilt (``ArchitectureField.build``).
LAYERS = "layers"
ROPE = "rope"
MODEL = "model"


def _is_fused_qkv(qkv_linear: Any) -> bool:
    return type(qkv_linear).__qualname__.startswith("FusedQKV")


@dataclass(frozen=True)
class ArchitectureField:
    """One number of the Qwen3 architecture."""

    name: str
    """The ``Qwen3Architecture`` attribute and the ``model.<name>`` override."""

    type: type
    titan: str
    """Where a built ``Qwen3Model.Config`` holds it: a dotted attribute path (list indices as numbers)."""

    build: tuple[str, ...]
    """What takes it when the config is rebuilt: ``layers`` (torchtitan's layer builders
    ``_build_qwen3_layers`` / ``_build_qwen3_moe_layers``, keyword ``name``), ``rope.<field>``
    (the rope config every layer shares), ``model.<field>`` (``Qwen3Model.Config`` itself)."""

    hf: str | None
    """Its key in an HF config.json (dotted: a key of a nested dict); None: native only."""

    kind: Kind = "common"
    """``dense`` / ``moe``: only models of that kind have it."""

    of_titan: Callable[[Any], Any] | None = None
    """The number, from what the ``titan`` path holds when that is not the number itself."""

    titan_older: tuple[str, ...] = ()
    """Where torchtitan main before 0.3 holds it, when ``titan`` is not there (the supported range)."""

    hf_older: tuple[str, ...] = ()
    """Older spellings of the HF key: read when ``hf`` is absent, dropped when it is written."""

    hf_default: Any = None
    """The value when an HF config has none of its keys (a callable gets the numbers read so far); None: required."""

    def read_titan(self, config: Qwen3Model.Config) -> Any:
        for path in (self.titan, *self.titan_older):
            value: Any = config
            for part in path.split("."):
                value = value[int(part)] if part.isdigit() else getattr(value, part, None)
                if value is None:
                    break
            else:
                return self.of_titan(value) if self.of_titan else value
        raise AttributeError(
            f"no {self.name} at {' or '.join((self.titan, *self.titan_older))} of torchtitan's {type(config).__qualname__}"
        )


FIELDS: tuple[ArchitectureField, ...] = (
    ArchitectureField("n_layers", int, "layers", (LAYERS,), "num_hidden_layers", of_titan=len),
    ArchitectureField("dim", int, "dim", (LAYERS, "model.dim"), "hidden_size"),
    ArchitectureField("n_heads", int, "layers.0.attention.n_heads", (LAYERS,), "num_attention_heads"),
    ArchitectureField(
        "n_kv_heads", int, "layers.0.attention.n_kv_heads", (LAYERS,), "num_key_value_heads", hf_default=lambda v: v["n_heads"]
    ),
    ArchitectureField(
        "head_dim", int, "layers.0.attention.head_dim", (LAYERS, "rope.dim"), "head_dim", hf_default=lambda v: v["dim"] // v["n_heads"]
    ),
    ArchitectureField("vocab_size", int, "vocab_size", ("model.vocab_size",), "vocab_size"),
    ArchitectureField(
        "max_seq_len",
        int,
        "layers.0.attention.rope.max_seq_len",
        ("rope.max_seq_len",),
        "max_position_embeddings",
        titan_older=("rope.max_seq_len",),
        hf_default=4096,
    ),
    ArchitectureField(
        "rope_theta",
        float,
        "layers.0.attention.rope.theta",
        ("rope.theta",),
        "rope_parameters.rope_theta",
        titan_older=("rope.theta",),
        hf_older=("rope_scaling.rope_theta", "rope_theta"),
        hf_default=10000.0,
    ),
    # HF keeps q/k/v separate either way
    ArchitectureField("fuse_qkv", bool, "layers.0.attention.qkv_linear", (LAYERS,), None, of_titan=_is_fused_qkv, hf_default=True),
    ArchitectureField(
        "tie_embeddings", bool, "enable_weight_tying", ("model.enable_weight_tying",), "tie_word_embeddings", hf_default=False
    ),
    ArchitectureField("hidden_dim", int, "layers.0.feed_forward.w1.out_features", (LAYERS,), "intermediate_size", kind="dense"),
    ArchitectureField(
        "num_experts", int, "layers.0.moe.num_experts", (LAYERS,), "num_experts", kind="moe", hf_older=("num_local_experts",)
    ),
    ArchitectureField("top_k", int, "layers.0.moe.router.top_k", (LAYERS,), "num_experts_per_tok", kind="moe"),
    ArchitectureField(
        "moe_hidden_dim",
        int,
        "layers.0.moe.routed_experts.inner_experts.hidden_dim",
        (LAYERS,),
        "moe_intermediate_size",
        kind="moe",
        titan_older=("layers.0.moe.experts.hidden_dim",),
    ),
)


def fields_of(kind: Kind) -> tuple[ArchitectureField, ...]:
    """The rows a model of ``kind`` (dense or moe) has."""
    return tuple(f for f in FIELDS if f.kind in ("common", kind))


def names_of(kind: Kind) -> str:
    """The rows only ``kind`` has, as messages list them ("num_experts/top_k/...")."""
    return "/".join(f.name for f in FIELDS if f.kind == kind)


class _ArchitectureMethods:
    """``Qwen3Architecture`` less its fields, which are the rows of ``FIELDS``."""

    @property
    def is_moe(self) -> bool:
        return self.num_experts is not None

    @property
    def kind(self) -> Kind:
        return "moe" if self.is_moe else "dense"

    def fields(self) -> tuple[ArchitectureField, ...]:
        return fields_of(self.kind)

    def titan_args(self, target: str) -> dict[str, Any]:
        """``{keyword: value}`` of the numbers ``target`` (``LAYERS``, ``ROPE`` or ``MODEL``) takes
        when the model config is rebuilt."""
        args = {}
        for field in self.fields():
            for place in field.build:
                taker, _, keyword = place.partition(".")
                if taker == target:
                    args[keyword or field.name] = getattr(self, field.name)
        return args

    @classmethod
    def of_flavor(cls, flavor: str) -> "Qwen3Architecture":
        if flavor not in qwen3_configs:
            raise ConfigError("model.flavor", f"unknown Qwen3 flavor '{flavor}'; torchtitan ships {', '.join(FLAVORS)}.")
        return cls.of_model_config(qwen3_configs[flavor](attn_backend="flex"))

    @classmethod
    def of_model_config(cls, config: Qwen3Model.Config) -> "Qwen3Architecture":
        """The numbers of a built torchtitan Qwen3 model config."""
        kind = "moe" if getattr(config.layers[0], "moe", None) is not None else "dense"
        return cls(**{field.name: field.read_titan(config) for field in fields_of(kind)})

    def requested_overrides(self, model: ModelConfig) -> dict[str, Any]:
        """The model group's non-null architecture keys."""
        return {f.name: getattr(model, f.name) for f in FIELDS if getattr(model, f.name, None) is not None}

    def keys_of_other_kind(self, requested: dict[str, Any]) -> list[str]:
        """Requested keys that apply only to the other kind of model (dense vs MoE)."""
        own = {f.name for f in self.fields()}
        return [k for k in requested if k not in own]

    def replaced(self, requested: dict[str, Any]) -> "Qwen3Architecture":
        arch = dataclasses.replace(self, **requested)
        arch.validate()
        return arch

    def with_overrides(self, model: ModelConfig) -> "Qwen3Architecture":
        requested = self.requested_overrides(model)
        wrong_kind = self.keys_of_other_kind(requested)
        if wrong_kind:
            kind, other = (
                ("an MoE", f"{names_of('dense')} applies to dense flavors; use model.moe_hidden_dim")
                if self.is_moe
                else ("a dense", f"{names_of('moe')} apply to MoE flavors (debugmodel_moe, 30B-A3B, 235B-A22B)")
            )
            raise NotApplicable(f"model.{wrong_kind[0]}", f"model={model.flavor} is {kind} flavor: {other}.")
        return self.replaced(requested)

    def validate(self) -> None:
        for field in self.fields():
            value = getattr(self, field.name)
            if field.type is int and value < 1:
                raise ConfigError(f"model.{field.name}", f"must be a positive integer, got {value}.")
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(
                "model.n_heads",
                f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads} "
                "(grouped-query attention shares each KV head among n_heads/n_kv_heads query heads); "
                "choose n_kv_heads that divides n_heads.",
            )
        if self.head_dim % 2:
            raise ConfigError("model.head_dim", f"must be even for rotary embeddings, got {self.head_dim}.")
        if self.is_moe and self.top_k > self.num_experts:
            raise ConfigError(
                "model.top_k",
                f"top_k={self.top_k} is larger than num_experts={self.num_experts}; "
                f"each token picks top_k distinct experts, so set model.top_k <= {self.num_experts}.",
            )

    def summary(self) -> dict[str, int | float | bool | None]:
        return dataclasses.asdict(self)


# One field per row of FIELDS; the numbers only the other kind of model has are None.
Qwen3Architecture = dataclasses.make_dataclass(
    "Qwen3Architecture",
    [(f.name, f.type, dataclasses.field()) if f.kind == "common" else (f.name, f.type | None, None) for f in FIELDS],
    bases=(_ArchitectureMethods,),
    frozen=True,
)
Qwen3Architecture.__module__ = __name__
