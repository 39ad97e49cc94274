"""Inner-attention choices for language-model layers.

torchtitan 0.3's ``get_attention_config`` refuses "sdpa" for language models because SDPA
cannot mask per document inside packed sequences. FlexAttention has no backward on CPU and
varlen needs CUDA, so CPU (and Neuron, whose SDPA is NKI-backed) train with causal SDPA:
the trainer then builds no masks and attention spans document boundaries in a packed row.
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
