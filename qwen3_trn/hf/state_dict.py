"""HF safetensors <-> torchtitan's transformers-backend model, dense and MoE Qwen3.

torchtitan's ``HFTransformerStateDictAdapter`` only strips the ``model.`` prefix, enough for dense
Qwen3. For MoE, torchtitan swaps each HF MoE block for its own ``MoE`` (grouped
``routed_experts`` tensors) while HF safetensors hold one tensor per expert: those keys go through
torchtitan's native ``Qwen3StateDictAdapter``, which converts sharded DTensors without gathering
them. torchtitan-only buffers (``expert_bias``, ``tokens_per_expert``) have no HF slot and are
left out.
"""

from __future__ import annotations

import re
from typing import Any

from qwen3_trn.models.hf_config import architecture_from_hf, hf_config_keys
from qwen3_trn.models.qwen3 import build_model_config
from qwen3_trn.titan import HFTransformerStateDictAdapter, Qwen3StateDictAdapter, ScaledDotProductAttention

# HF-backend (after the "model." prefix is stripped) <-> native torchtitan Qwen3 MoE names.
_BACKEND_MOE = re.compile(r"^model\.layers\.(\d+)\.mlp\.(router\.gate\.weight|routed_experts\.inner_experts\.w[123]\w*)$")
_NATIVE_MOE = re.compile(r"^layers\.(\d+)\.moe\.(router\.gate\.weight|routed_experts\.inner_experts\.w[123]\w*)$")
_HF_MOE = re.compile(r"^model\.layers\.\d+\.mlp\.(gate\.weight|experts\.\d+\.(gate|up|down)_proj\.weight)$")
_TITAN_ONLY = re.compile(r"^model\.layers\.\d+\.mlp\.(expert_bias\w*|tokens_per_expert\w*)$")


def _hf_config_values(model_config: Any) -> dict[str, Any]:
    return {k: getattr(model_config, k) for k in hf_config_keys() if getattr(model_config, k, None) is not None}


def native_moe_adapter(model_config: Any, hf_assets_path: str | None):
    """torchtitan's native Qwen3 adapter for the same MoE architecture (used for expert tensors)."""
    arch = architecture_from_hf(_hf_config_values(model_config), "the model config")
    native = build_model_config("debugmodel_moe", arch, ScaledDotProductAttention.Config())
    native.enable_weight_tying = False  # only expert/router tensors pass through it
    return Qwen3StateDictAdapter(native, hf_assets_path)


class Qwen3HFStateDictAdapter(HFTransformerStateDictAdapter):
    """``HFTransformerStateDictAdapter`` plus standard per-expert HF layout for Qwen3-MoE."""

    def __init__(self, model_config: Any, hf_assets_path: str | None):
        super().__init__(model_config, hf_assets_path)
        self._native = native_moe_adapter(model_config, hf_assets_path) if getattr(model_config, "is_moe", False) else None

    def _prune_index(self, hf_state_dict: dict[str, Any]) -> None:
        """Drop index keys this model never writes (a tied ``lm_head.weight``, old
        ``rotary_emb.inv_freq``): torchtitan's consolidation would write them without a dtype,
        leaving the file unreadable."""
        if not self.fqn_to_index_mapping:
            return
        for key in list(self.fqn_to_index_mapping):
            if key not in hf_state_dict and (key == "lm_head.weight" or key.endswith("rotary_emb.inv_freq")):
                del self.fqn_to_index_mapping[key]

    def to_hf(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        hf_state_dict = super().to_hf(state_dict)
        self._prune_index(hf_state_dict)
        if self._native is None:
            return hf_state_dict
        out, moe = {}, {}
        for key, value in hf_state_dict.items():
            if _TITAN_ONLY.match(key):
                continue
            match = _BACKEND_MOE.match(key)
            if match:
                moe[f"layers.{match.group(1)}.moe.{match.group(2)}"] = value
            else:
                out[key] = value
        out.update(self._native.to_hf(moe))
        return out

    def from_hf(self, hf_state_dict: dict[str, Any]) -> dict[str, Any]:
        if self._native is not None:
            moe = {k: v for k, v in hf_state_dict.items() if _HF_MOE.match(k)}
            rest = {k: v for k, v in hf_state_dict.items() if k not in moe}
            for key, value in self._native.from_hf(moe).items():
                match = _NATIVE_MOE.match(key)
                if match:
                    rest[f"model.layers.{match.group(1)}.mlp.{match.group(2)}"] = value
            hf_state_dict = rest
        return super().from_hf(hf_state_dict)
