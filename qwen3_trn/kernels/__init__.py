"""Kernels for Qwen3 training: the MoE expert operator and its kernels, chosen per device.

The package owns:

* the expert operator ``moe_swiglu_experts`` and its kernel registry (``registry``): the
  operator's schemas, fake kernels and autograd formula, its named kernels as ``torch.library``
  custom ops, the kernels each device runs in the order ``auto`` tries them, and the
  ``auto | portable | <name>`` selection with its errors;
* the kernels: ``grouped_mm`` (the portable default on CPU, CUDA and Neuron) in ``moe``,
  ``padded_bmm`` (CPU and CUDA; bf16 on balanced routing, widths ``grouped_mm`` refuses) in
  ``moe_padded``, and ``nki`` (Trainium, untested on hardware) in ``nki_moe``;
* the layouts between torchtitan's expert tensors and the NKI kernels' blockwise layouts, and the
  token-group alignment check for Neuron (``layouts``);
* ``KernelGroupedExperts``, the ``GroupedExperts`` swapped into torchtitan's model config by a
  ``ModelConfigConverter`` (``experts``).

Importing this package registers every kernel; Neuron modules are only imported when the
``nki`` kernel is selected. See README.md in this folder.
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
