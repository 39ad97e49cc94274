"""A ``GroupedExperts`` that runs ``moe_swiglu_experts`` through the registry, swapped in by a
model-config converter. It keeps ``GroupedExperts``' parameters, so checkpoints and state-dict
adapters are unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from qwen3_trn.common.local_tensors import local_tensor
from qwen3_trn.models.qwen3 import init_fields, replace_grouped_experts
from qwen3_trn.titan import GroupedExperts, ModelConfigConverter, Module, expert_weights, replaces_expert_math

from . import nki_moe  # noqa: F401  (registers the nki kernel; imports no Neuron module)
from .moe import moe_problem
from .registry import resolve_op, select_kernel, validate_request

__all__ = [
    "KernelExpertsConverter",
    "KernelGroupedExperts",
    "resolved_kernel_name",
    "use_kernel_experts",
]


def resolved_kernel_name(
    kernel: str,
    device_type: str,
    *,
    dim: int | None = None,
    hidden_dim: int | None = None,
    num_experts: int | None = None,
    **known: int,
) -> str:
    """The kernel ``backend.kernels=<kernel>`` runs on ``device_type``, for run summaries.

    Given one rank's expert shapes (``tokens``, ``logical_cores``: ``moe.moe_problem``) the kernels'
    shape limits apply as in the model. Raises ``KernelUnavailableError`` where the model would."""
    problem = None
    if dim is not None and hidden_dim is not None and num_experts is not None:
        problem = moe_problem(dim=dim, hidden_dim=hidden_dim, num_experts=num_experts, **known)
    return select_kernel(kernel, device_type, problem).name


@replaces_expert_math
class KernelGroupedExperts(GroupedExperts):
    """``GroupedExperts`` whose expert MLP runs the kernel ``config.kernel``
    (``auto | portable | <name>``), resolved against the inputs in forward (once, eagerly, at trace
    time under ``torch.compile``).

    It computes in the activations' dtype: bf16 under bf16 mixed precision, which is
    ``GroupedExperts``' math exactly, and fp32 in fp32 training, where ``GroupedExperts`` rounds to
    bf16 and back. Weights of another dtype are cast to it."""

    @dataclass(kw_only=True, slots=True)
    class Config(GroupedExperts.Config):
        kernel: str = "auto"

    def __init__(self, config: Config):
        super().__init__(config)
        validate_request(config.kernel)
        self.kernel = config.kernel

    def expert_math(self, x_RD: torch.Tensor, num_tokens_per_expert_E: torch.Tensor) -> torch.Tensor:
        # Under EP/TP the local shards are what the kernel sees (as in GroupedExperts).
        w1_EFD, w2_EDF, w3_EFD = (local_tensor(w) for w in expert_weights(self))
        experts, hidden_dim, dim = w1_EFD.shape
        problem = moe_problem(dim=dim, hidden_dim=hidden_dim, num_experts=experts)
        op = resolve_op(self.kernel, x_RD.device.type, problem)
        dtype = x_RD.dtype
        out_RD, _gate_RF, _up_RF = op(x_RD, w1_EFD.to(dtype), w2_EDF.to(dtype), w3_EFD.to(dtype), num_tokens_per_expert_E)
        return out_RD


def use_kernel_experts(model_config: Module.Config, *, kernel: str = "auto") -> Module.Config:
    """Replace every ``GroupedExperts.Config`` in ``model_config`` by a ``KernelGroupedExperts.Config``
    with the same fields; returns the (possibly new root) config.

    Raises on other ``GroupedExperts`` subclasses (fused, float8, ...): they change the math or the
    parameters."""
    validate_request(kernel)

    def with_kernel(fqn: str, config: GroupedExperts.Config) -> Module.Config:
        if isinstance(config, KernelGroupedExperts.Config):
            config.kernel = kernel
            return config
        if type(config) is GroupedExperts.Config:
            return KernelGroupedExperts.Config(**init_fields(config), kernel=kernel)
        raise ValueError(
            f"{fqn or 'model'}: {type(config).__qualname__} is a GroupedExperts variant with its own "
            "expert computation; kernel experts replace only plain GroupedExperts"
        )

    return replace_grouped_experts(model_config, with_kernel)


class KernelExpertsConverter(ModelConfigConverter):
    """Model-config converter: ``model_registry(..., converters=[KernelExpertsConverter.Config(kernel=...)])``."""

    @dataclass(kw_only=True, slots=True)
    class Config(ModelConfigConverter.Config):
        kernel: str = "auto"

    def __init__(self, config: Config):
        self.config = config

    def convert(self, model_config: Module.Config) -> Module.Config:
        return use_kernel_experts(model_config, kernel=self.config.kernel)
