"""A closed-form activation profile: the quick screen before the probe, and its fallback.

Bytes per token in units of the compute dtype's size, fitted to ``fit.probe``'s measurements of
torchtitan's Qwen3 (small shapes varied one at a time, bf16, no activation checkpointing)::

    dense block  10 dim + 6 (q + kv) + 4 hidden
    MoE block    10 dim + 6 (q + kv) + top_k (3 dim + 4 moe_hidden) + 2 num_experts (fp32 router scores)
    full AC      1 dim per block (its input), plus one block recomputed in backward
    selective AC a quarter of the block
    fixed        6 dim (embedding, final norm, the chunked loss's fp32 gradient accumulator)
                 + 3 x vocab / loss chunks in fp32 (one chunk's logits and their gradient)

A hand model: used only where it cannot change the answer or the probe cannot run.
"""

from __future__ import annotations

from qwen3_trn.models.architecture import Qwen3Architecture
from qwen3_trn.run.fit.probe import ActivationProfile

LOSS_CHUNKS = 8
AC_SHARE = {"none": 1.0, "selective": 0.25}


def block_elements(arch: Qwen3Architecture) -> int:
    attention = 10 * arch.dim + 6 * (arch.n_heads + arch.n_kv_heads) * arch.head_dim
    if arch.is_moe:
        return attention + arch.top_k * (3 * arch.dim + 4 * arch.moe_hidden_dim) + 2 * arch.num_experts
    return attention + 4 * arch.hidden_dim


def analytic_profile(
    arch: Qwen3Architecture, compute_bytes: int, activation_checkpoint: str, batch: int, seq_len: int
) -> ActivationProfile:
    tokens = batch * seq_len
    block = block_elements(arch) * compute_bytes * tokens
    fixed = tokens * (6 * arch.dim * compute_bytes + 3 * 4 * arch.vocab_size // LOSS_CHUNKS)
    if activation_checkpoint == "full":
        per_layer, fixed = arch.dim * compute_bytes * tokens, fixed + block
    else:
        per_layer = int(block * AC_SHARE[activation_checkpoint])
        fixed += block - per_layer
    return ActivationProfile(per_layer=per_layer, fixed=fixed, batch=batch, seq_len=seq_len)
