"""backend=hf_v5: Qwen3 built by Hugging Face Transformers v5 inside torchtitan's
``transformers_modeling_backend`` trainer, with HF safetensors in and out. Its ``config.json`` is
built from the ``model`` group (the same architecture as backend=native), or read from
``model.hf_model`` with the group's overrides on top (``qwen3_trn.models.hf_config``).

torchtitan's transformers backend (``qwen3_trn.hf.modeling``, which imports transformers) is
imported by the hooks that build with it, not with this module: every run registers this mode.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Callable

from qwen3_trn.backends.aligned_experts import align_token_groups, moe_token_groups, token_group_alignment
from qwen3_trn.backends.base import KERNEL_KEY, Backend, flavor_architecture
from qwen3_trn.common.errors import ConfigError
from qwen3_trn.config.option_schemas import HfV5BackendConfig
from qwen3_trn.config.schema import RunConfig
from qwen3_trn.devices import DeviceSpec
from qwen3_trn.hf.checkpoint import check_hf_checkpoint
from qwen3_trn.models.architecture import Qwen3Architecture
from qwen3_trn.models.hf_config import (
    hf_architecture_name,
    hf_config_dict,
    hf_model_architecture,
    load_hf_config,
    write_hf_config_dir,
)
from qwen3_trn.titan import TRANSFORMERS_BACKEND, ModelSpec

if TYPE_CHECKING:
    from qwen3_trn.hf.trainer import Qwen3HFTrainer

# The name torchtitan registers its flex-attention shim under in transformers' AttentionInterface.
TITAN_ATTENTION = "flex_torchtitan"
# Causal SDPA for HF attention, on devices whose default attention is SDPA (CPU, Neuron).
SDPA_ATTENTION = "qwen3_trn_causal_sdpa"


# --------------------------------------------------------------------------------------------
# Architecture and HF config
# --------------------------------------------------------------------------------------------


def architecture(cfg: RunConfig) -> Qwen3Architecture:
    """model.hf_model's config with the model group's overrides, else the model group's flavor."""
    if cfg.model.hf_model:
        return hf_model_architecture(cfg.model)
    return flavor_architecture(cfg)


def hf_config_dir(cfg: RunConfig, arch: Qwen3Architecture | None = None) -> str:
    """The directory holding the config.json torchtitan's transformers backend loads."""
    return str(write_hf_config_dir(hf_config(cfg, arch or architecture(cfg))))


def hf_config(cfg: RunConfig, arch: Qwen3Architecture) -> dict[str, Any]:
    return hf_config_dict(arch, _base(cfg))


def _base(cfg: RunConfig) -> dict[str, Any] | None:
    """model.hf_model's config.json (whose other fields the written config keeps), if given."""
    return load_hf_config(cfg.model.hf_model) if cfg.model.hf_model else None


# --------------------------------------------------------------------------------------------
# CPU and Neuron: the attention path
# --------------------------------------------------------------------------------------------


def _causal_sdpa_attention(module, query, key, value, attention_mask, **kwargs):
    """Causal SDPA for HF attention modules; no mask is passed (``use_causal_sdpa_attention``)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    kwargs.pop("is_causal", None)
    return sdpa_attention_forward(module, query, key, value, None, is_causal=True, **kwargs)


def _no_attention_masks(positions):
    return None


def runs_sdpa(device: DeviceSpec) -> bool:
    """Whether HF attention runs causal SDPA on this device (else torchtitan's flex path)."""
    return device.default_attention == "sdpa"


def use_causal_sdpa_attention(model_config: Any | None = None, parallelize_fn: Callable | None = None):
    """Causal SDPA in place of torchtitan's FlexAttention for HF attention, on CPU and Neuron
    (FlexAttention has no CPU backward, and its inductor-compiled BlockMask no Neuron code
    generation: docs/hardware.md). Registers the function (idempotent), points ``model_config``
    at it, and returns ``parallelize_fn`` wrapped so the model builds no BlockMask (transformers
    then passes a custom attention no mask). Same causal masking as torchtitan's default; as in
    backend=native's SDPA, documents packed into one row are not separated.
    """
    from transformers.modeling_utils import AttentionInterface

    AttentionInterface._global_mapping[SDPA_ATTENTION] = _causal_sdpa_attention
    if model_config is not None:
        model_config._titan_injected_model_args["attn_implementation"] = SDPA_ATTENTION
        model_config.attn_implementation = SDPA_ATTENTION
        model_config._attn_implementation = SDPA_ATTENTION
    if parallelize_fn is None:
        return None

    @functools.wraps(parallelize_fn)
    def parallelize(model, **kwargs):
        model.get_attention_masks = _no_attention_masks
        return parallelize_fn(model, **kwargs)

    return parallelize


def aligning_token_groups(parallelize_fn: Callable, alignment: int) -> Callable:
    """``parallelize_fn`` aligning the expert token groups of the torchtitan ``MoE`` swapped in for
    each HF MoE block: the config stored on the layer (``_native_moe_config``) is aligned just
    before ``parallelize_hf_transformers`` builds it."""

    @functools.wraps(parallelize_fn)
    def parallelize(model, **kwargs):
        for layer in model.layers.values():
            moe_config = getattr(layer, "_native_moe_config", None)
            if moe_config is not None:
                layer._native_moe_config = align_token_groups(moe_config, alignment)
        return parallelize_fn(model, **kwargs)

    return parallelize


# --------------------------------------------------------------------------------------------
# Backend hooks
# --------------------------------------------------------------------------------------------


class HfV5Backend(Backend):
    Config = HfV5BackendConfig

    description = "Qwen3 built by Hugging Face Transformers v5 in torchtitan's transformers_modeling_backend"
    config: Config

    def architecture(self, cfg: RunConfig) -> Qwen3Architecture:
        return architecture(cfg)

    def hf_config(self, cfg: RunConfig, arch: Qwen3Architecture) -> dict[str, Any]:
        return hf_config(cfg, arch)

    def model_spec(self, cfg: RunConfig, arch: Qwen3Architecture, device: DeviceSpec) -> ModelSpec:
        from qwen3_trn.hf.modeling import hf_model_spec

        def adapt(model_config: Any, parallelize: Callable) -> Callable:
            if runs_sdpa(device):
                parallelize = use_causal_sdpa_attention(model_config, parallelize)
            alignment = token_group_alignment(device.type)
            if arch.is_moe and alignment:
                parallelize = aligning_token_groups(parallelize, alignment)
            return parallelize

        return hf_model_spec(arch, self.config.hf_experts_implementation, hf_architecture_name(arch), adapt)

    def trainer_config_class(self) -> type[Qwen3HFTrainer.Config]:
        from qwen3_trn.hf.modeling import trainer_config_class

        return trainer_config_class()

    def trainer_fields(self, cfg: RunConfig) -> dict[str, Any]:
        return {"hf_model": hf_config_dir(cfg)}

    def validate(self, cfg: RunConfig, arch: Qwen3Architecture, device: DeviceSpec) -> None:
        if not TRANSFORMERS_BACKEND.available:
            raise TRANSFORMERS_BACKEND.refusal()
        impl = self.config.hf_experts_implementation
        if impl is not None:
            from qwen3_trn.hf.modeling import experts_implementations

            allowed = experts_implementations()
            if not arch.is_moe:
                raise ConfigError(
                    "backend.hf_experts_implementation",
                    f"'{impl}' selects the HF experts kernel of an MoE model, but this model is dense "
                    f"({hf_architecture_name(arch)}); unset it (backend.hf_experts_implementation=null) or train an MoE "
                    "(model=tiny_moe, model=30B-A3B).",
                )
            if impl not in allowed:
                raise ConfigError(
                    "backend.hf_experts_implementation",
                    f"'{impl}' is not one torchtitan's transformers backend accepts; use one of {', '.join(allowed)}.",
                )
        used = "sdpa" if runs_sdpa(device) else "flex"
        if cfg.model.attention not in ("auto", used):
            raise ConfigError(
                "model.attention",
                f"'{cfg.model.attention}' selects backend=native's inner attention; backend=hf_v5 runs HF attention through "
                f"torchtitan's flex path ({used} on {device.type}: causal SDPA on CPU and Neuron, FlexAttention on CUDA). "
                "Leave model.attention=auto.",
            )
        if arch.tie_embeddings and (cfg.parallelism.tp != 1 or cfg.parallelism.pp != 1):
            key = "parallelism.tp" if cfg.parallelism.tp != 1 else "parallelism.pp"
            raise ConfigError(
                key,
                f"this Qwen3 ties its input and output embeddings ({hf_architecture_name(arch)}, tie_word_embeddings); "
                "backend=hf_v5 keeps them tied under data parallelism (FSDP/HSDP) only (qwen3_trn.hf.model.TiedLMHead); "
                "torchtitan's transformers backend un-ties them for FSDP, after which its output-layer copy is left out "
                "of the optimizer and dropped by the HF export. Use parallelism.tp=1 "
                "parallelism.pp=1, or backend=native for tensor/pipeline parallelism of tied models.",
            )
        if cfg.checkpoint.initial_load_path and not cfg.checkpoint.resume_from:
            check_hf_checkpoint(cfg.checkpoint.initial_load_path, hf_config(cfg, arch), key="checkpoint.initial_load_path")

    def run_info(self, cfg: RunConfig, arch: Qwen3Architecture, device: DeviceSpec) -> dict[str, Any]:
        return {
            "hf_model": cfg.model.hf_model or "(built from the model group)",
            "hf_architecture": hf_architecture_name(arch),
            "hf_config_dir": hf_config_dir(cfg, arch),
            "hf_attention": SDPA_ATTENTION if runs_sdpa(device) else TITAN_ATTENTION,
            **(
                {key: self.config.hf_experts_implementation or "grouped_mm" for key in ("hf_experts_implementation", KERNEL_KEY)}
                if arch.is_moe
                else {}
            ),
            **(moe_token_groups(arch, device)),
        }

    def prepare_process(self, cfg: RunConfig, device: DeviceSpec) -> None:
        if runs_sdpa(device):
            use_causal_sdpa_attention()
