"""Kernels for Qwen3 training: the MoE expert operator ``moe_swiglu_experts`` and its kernels,
chosen per device (README.md in this folder).

Importing the package registers every kernel; Neuron modules are imported only when the ``nki``
kernel is selected.
"""

from . import moe_padded  # noqa: F401  (registers the padded_bmm kernel)
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
)
from .moe import moe_problem, moe_swiglu_experts
from .nki_moe import check_nki_moe_shapes, logical_neuron_cores, probe_nki
from .registry import (
    DEVICE_KERNELS,
    KERNELS,
    ExpertKernel,
    KernelUnavailableError,
    register_kernel,
    resolve_op,
    select_kernel,
)

__all__ = [
    "DEVICE_KERNELS",
    "KERNELS",
    "ExpertKernel",
    "KernelExpertsConverter",
    "KernelGroupedExperts",
    "KernelUnavailableError",
    "TokenGroupAlignmentError",
    "TokenGroupPlan",
    "check_nki_moe_shapes",
    "check_token_group_alignment",
    "logical_neuron_cores",
    "moe_problem",
    "moe_swiglu_experts",
    "probe_nki",
    "register_kernel",
    "resolve_op",
    "resolved_kernel_name",
    "select_kernel",
    "use_kernel_experts",
]
