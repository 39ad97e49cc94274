"""torchtitan's expert MLP with each expert's token group padded to an aligned row count.

Neuron's ``aten::_grouped_mm`` needs group offsets that are multiples of 128
(``torch_neuronx/python_ops/grouped_mm.py``: ``validate_offs``); torchtitan passes the raw routed
counts. ``AlignedGroupedExperts`` lays the rows into aligned blocks (``kernels.layouts``), runs
``GroupedExperts``' own math and takes the rows back, so parameters, init, sharding and math stay
torchtitan's; the zero padding rows add nothing. Swapped in by the ``TokenGroupAlignment``
converter (backend=native) and ``align_token_groups`` (backend=hf_v5).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from qwen3_trn.devices import DeviceSpec
from qwen3_trn.kernels.layouts import (
    NEURON_GROUPED_MM_ALIGNMENT,
    blockwise_routing,
    hidden_with_padding_row,
    padded_group_sizes,
    rows_from_blocks,
)
from qwen3_trn.kernels.moe import GROUPED_MM_TOKEN_ALIGNMENT
from qwen3_trn.models.architecture import Qwen3Architecture
from qwen3_trn.models.qwen3 import init_fields, replace_grouped_experts
from qwen3_trn.titan import GroupedExperts, ModelConfigConverter, Module, grouped_experts_math, replaces_expert_math

__all__ = ["AlignedGroupedExperts", "TokenGroupAlignment", "align_token_groups", "moe_token_groups", "token_group_alignment"]


def token_group_alignment(device_type: str) -> int | None:
    """Rows each expert's token group is padded to on this device; None keeps the raw counts."""
    return GROUPED_MM_TOKEN_ALIGNMENT.get(device_type)


def moe_token_groups(arch: Qwen3Architecture, device: DeviceSpec) -> dict[str, str]:
    """The token-group alignment a run records and ``mode=plan`` shows."""
    alignment = token_group_alignment(device.type)
    if not arch.is_moe or not alignment:
        return {}
    return {
        "moe_token_groups": f"each expert's rows padded to a multiple of {alignment} "
        f"(aten::_grouped_mm on {device.type} needs aligned group offsets)"
    }


@replaces_expert_math
class AlignedGroupedExperts(GroupedExperts):
    """``GroupedExperts`` whose grouped matmuls see token groups of a multiple of
    ``token_group_alignment`` rows each."""

    @dataclass(kw_only=True, slots=True)
    class Config(GroupedExperts.Config):
        token_group_alignment: int = NEURON_GROUPED_MM_ALIGNMENT

    def __init__(self, config: Config):
        super().__init__(config)
        self.token_group_alignment = config.token_group_alignment

    def expert_math(self, x_RD: torch.Tensor, num_tokens_per_expert_E: torch.Tensor) -> torch.Tensor:
        routing = blockwise_routing(num_tokens_per_expert_E, num_rows=x_RD.shape[0], block_size=self.token_group_alignment)
        x_blocks = hidden_with_padding_row(x_RD).index_select(0, routing.token_position_to_id)
        out_blocks = grouped_experts_math(self, x_blocks, padded_group_sizes(routing, num_tokens_per_expert_E.shape[0]))
        return rows_from_blocks(out_blocks, routing)


def align_token_groups(model_config: Module.Config, alignment: int) -> Module.Config:
    """Replace every plain ``GroupedExperts.Config`` in ``model_config`` by an
    ``AlignedGroupedExperts.Config`` with the same fields; returns the (possibly new root) config.
    Other ``GroupedExperts`` variants compute their own way and are kept."""

    def aligned(_fqn: str, config: GroupedExperts.Config) -> Module.Config:
        if type(config) is not GroupedExperts.Config:
            return config
        return AlignedGroupedExperts.Config(**init_fields(config), token_group_alignment=alignment)

    return replace_grouped_experts(model_config, aligned)


class TokenGroupAlignment(ModelConfigConverter):
    """Model-config converter: ``converters=[TokenGroupAlignment.Config(alignment=...)]``."""

    @dataclass(kw_only=True, slots=True)
    class Config(ModelConfigConverter.Config):
        alignment: int = NEURON_GROUPED_MM_ALIGNMENT

    def __init__(self, config: Config):
        self.config = config

    def convert(self, model_config: Module.Config) -> Module.Config:
        return align_token_groups(model_config, self.config.alignment)
