"""Inner attention per device. torchtitan 0.3 refuses SDPA for language models (it cannot mask
per document in packed rows), but FlexAttention has no CPU backward and varlen needs CUDA, so
CPU and Neuron train with causal SDPA: attention then spans document boundaries in a packed row.
"""

from __future__ import annotations

from qwen3_trn.common.errors import ConfigError
from qwen3_trn.titan import Module, attention_config

ATTENTION_BACKENDS = ("sdpa", "flex", "flex_flash", "varlen")


def resolve_attention(requested: str, device_default: str) -> str:
    name = device_default if requested == "auto" else requested
    if name not in ATTENTION_BACKENDS:
        raise ConfigError("model.attention", f"unknown attention '{requested}'; use auto or one of {', '.join(ATTENTION_BACKENDS)}.")
    return name


def inner_attention_config(name: str) -> Module.Config:
    return attention_config(name)
