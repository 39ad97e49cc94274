"""backend=native: torchtitan's own Qwen3 (torchtitan.models.qwen3)."""

from __future__ import annotations

from typing import Any

from qwen3_trn.backends.aligned_experts import TokenGroupAlignment, moe_token_groups, token_group_alignment
from qwen3_trn.backends.base import Backend
from qwen3_trn.config.option_schemas import NativeBackendConfig
from qwen3_trn.config.schema import RunConfig
from qwen3_trn.devices import DeviceSpec
from qwen3_trn.models.architecture import Qwen3Architecture
from qwen3_trn.models.attention import inner_attention_config, resolve_attention
from qwen3_trn.models.qwen3 import native_model_spec
from qwen3_trn.titan import ModelSpec


class NativeBackend(Backend):
    Config = NativeBackendConfig

    description = "torchtitan's native Qwen3 (dense and MoE flavors)"

    def model_spec(self, cfg: RunConfig, arch: Qwen3Architecture, device: DeviceSpec) -> ModelSpec:
        attention = resolve_attention(cfg.model.attention, device.default_attention)
        alignment = token_group_alignment(device.type)
        converters = [TokenGroupAlignment.Config(alignment=alignment)] if arch.is_moe and alignment else []
        return native_model_spec(cfg.model.flavor, arch, inner_attention_config(attention), converters=converters)

    def run_info(self, cfg: RunConfig, arch: Qwen3Architecture, device: DeviceSpec) -> dict[str, Any]:
        return moe_token_groups(arch, device)
