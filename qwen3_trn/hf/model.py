"""What makes torchtitan's transformers-backend model train like native Qwen3: tied embeddings
that stay tied, the buffers torchtitan leaves uninitialised, and native Qwen3's initialisation.
"""

from __future__ import annotations

import functools
import re
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from qwen3_trn.common.local_tensors import local_tensor
from qwen3_trn.titan import _EMBEDDING_INIT, _LINEAR_INIT, _NORM_INIT, MoE, _residual_output_weight_init


class TiedLMHead(nn.Module):
    """An output projection that uses the input embedding's weight (no parameter of its own)."""

    def __init__(self, embedding: nn.Module) -> None:
        super().__init__()
        # A tuple, so the embedding is not registered twice in the module tree / state dict.
        self._tied_to = (embedding,)
        self.bias = None
        self.in_features = embedding.weight.shape[1]
        self.out_features = embedding.weight.shape[0]

    @property
    def weight(self) -> torch.Tensor:
        return self._tied_to[0].weight

    def __setattr__(self, name: str, value: Any) -> None:
        # transformers' tie_weights() assigns the embedding weight to lm_head.weight: already so.
        if name == "weight":
            if value is not self._tied_to[0].weight:
                raise ValueError("TiedLMHead's weight is the input embedding's weight; it cannot be replaced.")
            return
        super().__setattr__(name, value)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden_states, self.weight)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, tied to the input embedding"


def is_tied(model: nn.Module) -> bool:
    head, embedding = model.lm_head, model.tok_embeddings
    return isinstance(head, TiedLMHead) or (getattr(head, "weight", None) is not None and head.weight is getattr(embedding, "weight", None))


def keep_embeddings_tied(model: nn.Module) -> bool:
    """Swap a tied ``lm_head`` for ``TiedLMHead``; True when the model is tied."""
    if isinstance(model.lm_head, TiedLMHead):
        return True
    if not is_tied(model):
        return False
    model.lm_head = TiedLMHead(model.tok_embeddings)
    return True


def parallelize_keeping_tied_embeddings(parallelize_fn: Callable) -> Callable:
    """``parallelize_fn`` (torchtitan's ``parallelize_hf_transformers``) on a model whose tied
    ``lm_head`` was first replaced by ``TiedLMHead``. torchtitan un-ties it for FSDP and re-ties it
    after wrapping, so the optimizer saw one parameter while the forward used the clone FSDP
    restores: the output layer never trained, and the HF export (without ``lm_head.weight``) was
    not the model that trained. The shared parameter joins the embedding's FSDP unit, as in
    native Qwen3."""

    @functools.wraps(parallelize_fn)
    def parallelize(model: nn.Module, **kwargs):
        keep_embeddings_tied(model)
        return parallelize_fn(model, **kwargs)

    return parallelize


# --------------------------------------------------------------------------------------------
# Rotary buffers
# --------------------------------------------------------------------------------------------


@torch.no_grad()
def reset_rotary_buffers(model: nn.Module) -> int:
    """Recompute ``inv_freq`` / ``original_inv_freq`` / ``attention_scaling`` of every HF rotary
    embedding as its ``__init__`` does; returns how many modules were reset."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    count = 0
    for module in model.modules():
        inv_freq = getattr(module, "inv_freq", None)
        config = getattr(module, "config", None)
        if inv_freq is None or config is None or not hasattr(module, "rope_type"):
            continue
        if module.rope_type == "default" and hasattr(module, "compute_default_rope_parameters"):
            init_fn = module.compute_default_rope_parameters
        else:
            init_fn = ROPE_INIT_FUNCTIONS[module.rope_type]
        local = local_tensor(inv_freq)
        value, module.attention_scaling = init_fn(config, device=local.device)
        local.copy_(value.to(local.dtype))
        original = getattr(module, "original_inv_freq", None)
        if original is not None:
            local_tensor(original).copy_(value.to(local.dtype))
        count += 1
    return count


@torch.no_grad()
def reset_moe_buffers(model: nn.Module) -> int:
    """Zero the Titan MoE load-balancing buffers in place (as ``MoE._init_self_buffers`` does)."""
    count = 0
    for module in model.modules():
        if isinstance(module, MoE):
            for name in ("expert_bias_E", "tokens_per_expert_E"):
                buffer = getattr(module, name, None)
                if buffer is not None:
                    local_tensor(buffer).zero_()
            count += 1
    return count


def reset_unset_buffers(model: nn.Module) -> None:
    """Initialise what the trainer's ``to_empty()`` + ``init_states()`` leave as garbage: rotary
    ``inv_freq`` (``init_states`` recomputes it from a ``rope_init_fn`` transformers 5.24 no longer
    has) and the swapped-in ``MoE``'s load-balancing buffers (zeroed before ``to_empty()`` only).
    Neither is in an HF checkpoint, so this runs on every build."""
    reset_rotary_buffers(model)
    reset_moe_buffers(model)


# --------------------------------------------------------------------------------------------
# Native initialisation
# --------------------------------------------------------------------------------------------


def native_init_plan(n_layers: int, is_moe: bool, tied: bool) -> list[tuple[re.Pattern, Callable]]:
    """(parameter-name pattern, init function) pairs as torchtitan's native Qwen3 builders
    (``torchtitan.models.qwen3``) initialise: std 0.02 for linears and embeddings, ones for norms,
    ``0.02 / sqrt(2 * n_layers)`` for MoE layers' attention output and expert down projection.
    A tied embedding is drawn once, by the output layer's init."""
    linear, norm, residual = _LINEAR_INIT["weight"], _NORM_INIT["weight"], _residual_output_weight_init(n_layers)
    plan = [
        (r"embed_tokens\.weight", linear if tied else _EMBEDDING_INIT["weight"]),
        (r"self_attn\.[qkv]_proj\.weight", linear),
        (r"self_attn\.o_proj\.weight", residual if is_moe else linear),
        (r"(self_attn\.[qk]_norm|input_layernorm|post_attention_layernorm|model\.norm)\.weight", norm),
        (r"mlp\.(gate|up|down)_proj\.weight", linear),
        (r"mlp\.router\.gate\.weight", linear),
        (r"mlp\.routed_experts\.inner_experts\.w[13]\w*", linear),
        (r"mlp\.routed_experts\.inner_experts\.w2\w*", residual),
        (r"lm_head\.weight", linear),
    ]
    return [(re.compile(rf"(^|\.){pattern}$"), fn) for pattern, fn in plan]


@torch.no_grad()
def init_like_native(model: nn.Module, n_layers: int, is_moe: bool) -> list[str]:
    """Re-draw every parameter of the HF-backend ``model`` as native Qwen3 does (torchtitan's HF
    init draws a tied embedding with std ``hidden_size**-0.5``: a first loss near 14 on the tiny
    model); returns the names no rule covered, left as torchtitan initialised them."""
    plan = native_init_plan(n_layers, is_moe, tied=is_tied(model))
    uncovered = []
    for name, param in model.named_parameters():
        for pattern, init in plan:
            if pattern.search(name):
                init(param)
                break
        else:
            uncovered.append(name)
    return uncovered
