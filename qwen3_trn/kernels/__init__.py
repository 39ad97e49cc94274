"""Kernels for Qwen3 training: operators declared once, implementations chosen per device.

The package owns:

* the kernel registry (``registry``): operator declarations (schema, fake kernel, autograd
  formula), per-device implementations as ``torch.library`` custom ops, and the
  ``auto | portable | <name>`` selection with its errors;
* the MoE expert operator ``moe_swiglu_experts`` and its kernels: ``grouped_mm`` (CPU and CUDA default,
  Neuron portable), ``per_expert_mm`` in ``moe``, ``padded_bmm`` in ``moe_padded``, and ``nki`` (Trainium, untested on hardware) in ``nki_moe``;
* the layouts between torchtitan's expert tensors and the NKI kernels' blockwise layouts, and the
  token-group alignment check for Neuron (``layouts``);
* ``KernelGroupedExperts``, the ``GroupedExperts`` swapped into torchtitan's model config by a
  ``ModelConfigConverter`` (``experts``).

Importing this package registers every operator and implementation; Neuron modules are only
imported when the ``nki`` kernel is selected. See README.md in this folder.
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
from .moe import MOE_SWIGLU_EXPERTS, moe_problem, moe_swiglu_experts
from .nki_moe import check_nki_moe_shapes, logical_neuron_cores, probe_nki
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
