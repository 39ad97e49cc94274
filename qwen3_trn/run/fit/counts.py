"""Parameters and FLOPs per token, counted as torchtitan counts them.

The model is torchtitan's Qwen3 built on the meta device (well under a second even for
235B-A22B); totals and FLOPs are ``get_nparams_and_flops``, the figure torchtitan's MFU uses.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

import torch

from qwen3_trn.common.quiet import logging_disabled
from qwen3_trn.models.architecture import Qwen3Architecture
from qwen3_trn.models.qwen3 import build_model_config
from qwen3_trn.titan import Qwen3Model, ScaledDotProductAttention

# Name fragments torchtitan's get_moe_model_nparams_and_flops sorts parameters by.
EMBEDDING, ROUTER, SHARED_EXPERTS, ROUTED_EXPERTS = "embedding", "moe.router", "moe.shared_experts", "moe.routed_experts"


@dataclass(frozen=True)
class Parameter:
    """One parameter of the model as torchtitan names and shapes it (before any sharding)."""

    fqn: str
    shape: tuple[int, ...]
    # Bytes per element where the dtype is fixed (buffers); parameters follow the run's dtypes.
    itemsize: int = 0

    @property
    def numel(self) -> int:
        n = 1
        for size in self.shape:
            n *= size
        return n

    @property
    def module(self) -> str:
        """The top-level module holding it, as torchtitan's pipeline split names them
        (``tok_embeddings``, ``layers.<i>``, ``norm``, ``lm_head``)."""
        parts = self.fqn.split(".")
        return ".".join(parts[:2]) if parts[0] == "layers" else parts[0]

    @property
    def is_routed_expert(self) -> bool:
        return ROUTED_EXPERTS in self.fqn


@dataclass(frozen=True)
class ModelCounts:
    total: int
    # Parameters one token passes through: dense + router + shared experts + top_k/num_experts
    # of the routed experts (torchtitan's convention: embeddings included).
    active: int
    embedding: int
    flops_per_token: int
    seq_len: int
    n_layers: int
    parameters: tuple[Parameter, ...]
    buffers: tuple[Parameter, ...]

    @property
    def non_embedding(self) -> int:
        """Without the input embedding and an untied output projection (the model cards' figure)."""
        return self.total - self.embedding - sum(p.numel for p in self.parameters if p.module == "lm_head")

    def to_record(self) -> dict[str, int]:
        return {
            "total": self.total,
            "active": self.active,
            "embedding": self.embedding,
            "non_embedding": self.non_embedding,
            "flops_per_token": self.flops_per_token,
            "seq_len": self.seq_len,
        }


def meta_model(config: Qwen3Model.Config) -> torch.nn.Module:
    with torch.device("meta"):
        return config.build()


def count(flavor: str, arch: Qwen3Architecture, seq_len: int) -> ModelCounts:
    # torchtitan sizes the RoPE caches (buffers) to the training sequence length before it builds.
    config = build_model_config(flavor, dataclasses.replace(arch, max_seq_len=seq_len), ScaledDotProductAttention.Config())
    model = meta_model(config)
    with logging_disabled(logging.INFO):  # torchtitan logs its per-kind counts at INFO
        total, flops_per_token = config.get_nparams_and_flops(model, seq_len)
    parameters = tuple(Parameter(name, tuple(p.shape)) for name, p in model.named_parameters())
    by_kind = {EMBEDDING: 0, ROUTER: 0, SHARED_EXPERTS: 0, ROUTED_EXPERTS: 0, "dense": 0}
    for parameter in parameters:
        kind = next((k for k in (EMBEDDING, SHARED_EXPERTS, ROUTER, ROUTED_EXPERTS) if k in parameter.fqn), "dense")
        by_kind[kind] += parameter.numel
    routed_active = by_kind[ROUTED_EXPERTS] * arch.top_k // arch.num_experts if arch.is_moe else 0
    active = by_kind["dense"] + by_kind[EMBEDDING] + by_kind[ROUTER] + by_kind[SHARED_EXPERTS] + routed_active
    return ModelCounts(
        total=total,
        active=active,
        embedding=by_kind[EMBEDDING],
        flops_per_token=flops_per_token,
        seq_len=seq_len,
        n_layers=arch.n_layers,
        parameters=parameters,
        buffers=tuple(Parameter(name, tuple(b.shape), b.element_size()) for name, b in model.named_buffers()),
    )
