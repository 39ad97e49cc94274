"""Kernels for Qwen3 training: operators declared once, implementations chosen per device.

Importing this package registers every operator and implementation; NKI (Trainium) modules are
only imported when the ``nki`` kernel is selected. See README.md in this folder.
"""

from .experts import (
    KernelExpertsConverter,
    KernelGroupedExperts,
    resolved_kernel_name,
    use_kernel_experts,
)
from .layouts import (
    TokenGroupAlignmentError,
    TokenGroupPlan,
    check_token_group_alignment,
    rope_half_split_to_interleaved,
    rope_interleaved_to_half_split,
)
from .moe import MOE_SWIGLU_EXPERTS, moe_swiglu_experts
from .nki_moe import check_nki_moe_shapes, probe_nki
from .registry import (
    KERNELS,
    KernelChoice,
    KernelRegistry,
    KernelUnavailableError,
    OpDeclaration,
    declare_op,
    register_kernel,
    resolve_op,
    select_kernel,
)

__all__ = [
    "KERNELS",
    "MOE_SWIGLU_EXPERTS",
    "KernelChoice",
    "KernelExpertsConverter",
    "KernelGroupedExperts",
    "KernelRegistry",
    "KernelUnavailableError",
    "OpDeclaration",
    "TokenGroupAlignmentError",
    "TokenGroupPlan",
    "check_nki_moe_shapes",
    "check_token_group_alignment",
    "declare_op",
    "moe_swiglu_experts",
    "probe_nki",
    "register_kernel",
    "resolve_op",
    "resolved_kernel_name",
    "rope_half_split_to_interleaved",
    "rope_interleaved_to_half_split",
    "select_kernel",
    "use_kernel_experts",
]
