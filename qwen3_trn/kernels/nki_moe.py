"""NKI implementation of ``moe_swiglu_experts`` on Trainium, via nki-library's blockwise kernels.

UNTESTED ON HARDWARE: written against the public sources of torch-neuronx and nki-library
(README.md in this folder, "NKI status"); imported only when the ``nki`` kernel is selected.
The plumbing around the launches is tested on CPU with ``blockwise_moe_reference`` and
``blockwise_moe_backward_reference``, pure-torch ports of the kernels' documented semantics.

The forward launches moe_cte's ``shard_on_i`` kernel with activation checkpoints; the backward
``blockwise_mm_bwd``. ``probe_nki`` checks every name they use; ``NKI_KERNEL_LIMITS`` holds the
kernels' shape limits with the file setting each. Layouts: ``kernels.layouts``.
"""

import functools
import importlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from .layouts import (
    BlockwiseRouting,
    block_gate_up_T_to_rows,
    blocks_from_rows,
    blockwise_routing,
    down_from_w2,
    gate_up_from_w1_w3,
    hidden_with_padding_row,
    row_expert_affinities,
    rows_to_block_gate_up_T,
    w1_w3_from_gate_up,
    w2_from_down,
)
from .registry import ExpertKernel, register_kernel

__all__ = [
    "NKI",
    "NKI_BLOCK_SIZE",
    "NKI_IMPORTS",
    "NKI_KERNEL_LIMITS",
    "NkiKernelLimit",
    "NkiMoeShape",
    "blockwise_moe_backward_reference",
    "blockwise_moe_reference",
    "check_nki_moe_shapes",
    "logical_neuron_cores",
    "nki_moe_backward_with",
    "nki_moe_forward_with",
    "probe_nki",
]

# Tokens per block. moe_cte's shard_on_i needs a multiple of 256; blockwise_mm_bwd accepts
# 128/256/512/1024. 256 is the smallest size both accept.
NKI_BLOCK_SIZE = 256
LOGICAL_CORES_ENV = "NEURON_LOGICAL_NC_CONFIG"
DEFAULT_LOGICAL_CORES = 2  # trn2's default LNC
_INSTALL_HINT = (
    "The nki kernel needs a Trainium host with the AWS Neuron SDK: torch-neuronx (which brings "
    "nki) and an nki-library (nkilib) that has the kernels named here; the copy bundled with "
    "neuronx-cc may lag the repository (github.com/aws-neuron/nki-library). Install a matching "
    "one, or use backend.kernels=portable (or backend.kernels=auto) to run a portable kernel."
)


# --------------------------------------------------------------------------- what the launches call
@dataclass(frozen=True)
class NkiKernelCall:
    """An nki-library kernel the launches call, and the arguments they pass it by name.

    torch-neuronx's ``NKIHOPCaller.__call__`` (torch_neuronx/nki_hop.py) keeps only the
    arguments named in the kernel's signature (``kernel.sign``), so a name the kernel lacks
    would be dropped without a word: :func:`probe_nki` checks every name here.
    """

    module: str
    name: str
    arguments: tuple[str, ...]


_ROUTING_ARGS = ("hidden_states", "expert_affinities_masked", "gate_up_proj_weight", "down_proj_weight")
_BLOCK_ARGS = ("token_position_to_id", "block_to_expert", "block_size")
# moe_cte's shard_on_i branch (nkilib/core/moe/moe_cte/moe_cte.py) calls this kernel with the
# fields of its MoECTESpec. The spec itself is a mutable dataclass, unhashable, and
# torch-neuronx refuses unhashable constants (nki_kernel.py, _return_shape_dtype_or_hashable),
# so the launch passes the fields: bools and an enum, all hashable.
FORWARD_KERNEL = NkiKernelCall(
    "nkilib.core.moe.moe_cte.bwmm_shard_on_I",
    "blockwise_mm_baseline_shard_intermediate",
    (
        *_ROUTING_ARGS,
        *_BLOCK_ARGS,
        "checkpoint_activation",
        "expert_affinity_multiply_on_I",
        "expert_affinities_scaling_mode",
    ),
)
BACKWARD_KERNEL = NkiKernelCall(
    "nkilib.experimental.moe.bwd.blockwise_mm_backward",
    "blockwise_mm_bwd",
    (
        *_ROUTING_ARGS,
        "gate_up_proj_act_checkpoint_T",
        "down_proj_act_checkpoint",
        "token_position_to_id",
        "block_to_expert",
        "output_hidden_states_grad",
        "block_size",
    ),
)
# moe_cte's default scaling mode; the shard_on_i kernel's own default is PRE_SCALE.
POST_SCALE = ("nkilib.core.utils.common_types", "ExpertAffinityScaleMode.POST_SCALE")
# Everything the launches and the operator factory use, as (module, attribute path).
NKI_IMPORTS: tuple[tuple[str, str], ...] = (
    ("torch_neuronx", "nki_op"),
    ("torch_neuronx", "wrap_nki"),
    POST_SCALE,
    (FORWARD_KERNEL.module, FORWARD_KERNEL.name),
    (BACKWARD_KERNEL.module, BACKWARD_KERNEL.name),
)


def _resolve(module: str, path: str) -> Any:
    found = importlib.import_module(module)
    for attribute in path.split("."):
        found = getattr(found, attribute)
    return found


def _missing_arguments(kernel: Any, call: NkiKernelCall) -> str | None:
    """Why ``wrap_nki`` could not pass ``call.arguments`` to ``kernel``, if it could not."""
    signature = getattr(kernel, "sign", None)  # what wrap_nki reads (torch_neuronx/nki_hop.py)
    if signature is None:
        return f"{call.module}.{call.name} has no .sign, so it is not an NKI kernel torch_neuronx.wrap_nki can launch"
    missing = [name for name in call.arguments if name not in signature.parameters]
    if missing:
        return f"{call.module}.{call.name} takes no argument(s) {', '.join(missing)}: this nki-library has another version of the kernel"
    return None


# torch-neuronx launches NKI kernels through nki's V2 front end: where ``nki`` lacks it,
# torch_neuronx/nki_kernel.py sets this flag False and its ``UnifiedKernelV2`` is a placeholder
# whose constructor raises NotImplementedError at the first launch.
NKI_V2_FLAG = ("torch_neuronx.nki_kernel", "IS_NKI_V2_AVAILABLE")


def probe_nki() -> str | None:
    """None when everything the nki launches call imports, else what is missing and how to fix it."""
    for module, path in (*NKI_IMPORTS, NKI_V2_FLAG):
        try:
            _resolve(module, path)
        except Exception as exc:  # noqa: BLE001 - any import failure makes NKI unusable
            return f"{module}.{path} cannot be used ({type(exc).__name__}: {exc}). {_INSTALL_HINT}"
    if _resolve(*NKI_V2_FLAG) is not True:
        return (
            f"{'.'.join(NKI_V2_FLAG)} is False: this torch-neuronx found no nki V2 (nki.compiler.backends.neuron."
            "FrameworkKernel), so its first NKI launch raises NotImplementedError. Install the nki package of the same "
            f"Neuron SDK release. {_INSTALL_HINT}"
        )
    for call in (FORWARD_KERNEL, BACKWARD_KERNEL):
        reason = _missing_arguments(_resolve(call.module, call.name), call)
        if reason is not None:
            return f"{reason}. {_INSTALL_HINT}"
    return None


# --------------------------------------------------------------------------- kernel limits
@dataclass(frozen=True)
class NkiMoeShape:
    """What the kernels see on one rank: local expert weights, the logical NeuronCores a launch
    spans, and the rows of a call where known."""

    dim: int  # H
    hidden_dim: int  # I (I_TP: after tensor parallel)
    num_experts: int  # E on this rank (after expert parallel)
    logical_cores: int = DEFAULT_LOGICAL_CORES
    tokens: int | None = None  # T: rows per call (every routed row is one kernel token)
    block_size: int = NKI_BLOCK_SIZE


@dataclass(frozen=True)
class NkiKernelLimit:
    """One limit of the nki-library kernels, and the file of aws-neuron/nki-library that sets it."""

    holds: Callable[[NkiMoeShape], bool]
    says: Callable[[NkiMoeShape], str]
    source: str


_SHARD_ON_I = "nkilib/core/moe/moe_cte/bwmm_shard_on_I.py"
_BWD_PARAMETERS = "nkilib/experimental/moe/bwd/moe_bwd_parameters.py"
# Limits implied by others (the backward's H % 2 and I_TP % 2) are not repeated.
NKI_KERNEL_LIMITS: tuple[NkiKernelLimit, ...] = (
    NkiKernelLimit(
        lambda s: s.block_size in (128, 256, 512, 1024),
        lambda s: f"block size {s.block_size} must be 128, 256, 512 or 1024",
        f"{_BWD_PARAMETERS} (MOEBwdParameters.validate)",
    ),
    NkiKernelLimit(
        lambda s: s.block_size % 256 == 0,
        lambda s: f"block size {s.block_size} must be a multiple of 256",
        f"{_SHARD_ON_I} (check_blockwise_mm_shard_I_kernel_compatibility)",
    ),
    NkiKernelLimit(
        lambda s: 512 <= s.dim <= 8192 and s.dim % 512 == 0,
        lambda s: f"dim (H) = {s.dim} must be a multiple of 512 in [512, 8192]",
        f"{_SHARD_ON_I} (check_blockwise_mm_shard_I_kernel_compatibility)",
    ),
    NkiKernelLimit(
        lambda s: s.hidden_dim % 16 == 0,
        lambda s: f"expert hidden_dim (I) on a rank = {s.hidden_dim} must be a multiple of 16",
        f"{_SHARD_ON_I} (check_blockwise_mm_shard_I_kernel_compatibility)",
    ),
    NkiKernelLimit(
        lambda s: s.logical_cores == 2,
        lambda s: (
            f"{LOGICAL_CORES_ENV}={s.logical_cores}: the forward kernel needs 2 logical NeuronCores (LNC=2); its trace "
            "exchanges each block's output with the other shard (sendrecv to rank 1 - shard_id, the second shard's tiles)"
        ),
        f"{_SHARD_ON_I} (compute_down_proj_shard_on_intermediate)",
    ),
    NkiKernelLimit(
        lambda s: s.dim % s.logical_cores == 0 and (s.dim // s.logical_cores) % 32 == 0,
        lambda s: f"dim (H) = {s.dim} over {s.logical_cores} logical core(s) must be a multiple of 32",
        f"{_BWD_PARAMETERS} (MOEBwdParameters.validate_sharding)",
    ),
    NkiKernelLimit(
        lambda s: (s.hidden_dim // s.logical_cores) % 32 == 0,
        lambda s: f"expert hidden_dim (I) on a rank = {s.hidden_dim} over {s.logical_cores} logical core(s) must be a multiple of 32",
        f"{_BWD_PARAMETERS} (MOEBwdParameters.validate_sharding)",
    ),
    NkiKernelLimit(
        lambda s: 8 <= s.num_experts <= 64,
        lambda s: f"{s.num_experts} expert(s) per rank is outside the kernel's documented 8-64",
        f"{_SHARD_ON_I} (blockwise_mm_baseline_shard_intermediate, Intended Usage)",
    ),
    NkiKernelLimit(
        lambda s: s.tokens is None or s.tokens <= 32 * 1024,
        lambda s: f"up to {s.tokens} rows per call is above the kernel's documented 32K tokens per call",
        f"{_SHARD_ON_I} (blockwise_mm_baseline_shard_intermediate, Intended Usage)",
    ),
)


def logical_neuron_cores(env: Mapping[str, str] | None = None) -> int:
    """LNC of the ranks: ``NEURON_LOGICAL_NC_CONFIG`` from ``env``, else this process's, else trn2's 2."""
    value = (env or {}).get(LOGICAL_CORES_ENV) or os.environ.get(LOGICAL_CORES_ENV) or DEFAULT_LOGICAL_CORES
    return int(value)


def check_nki_moe_shapes(problem: Mapping[str, int]) -> str | None:
    """Every limit of moe_cte's shard_on_i kernel and blockwise_mm_bwd that ``problem`` breaks
    (``logical_cores`` defaults to this process's LNC)."""
    shape = NkiMoeShape(
        dim=problem["dim"],
        hidden_dim=problem["hidden_dim"],
        num_experts=problem["num_experts"],
        logical_cores=problem.get("logical_cores") or _logical_neuron_cores(),
        tokens=problem.get("tokens"),
    )
    broken = [f"{limit.says(shape)} ({limit.source})" for limit in NKI_KERNEL_LIMITS if not limit.holds(shape)]
    return "; ".join(broken) or None


# --------------------------------------------------------------------------- plumbing
# A launcher takes the kernel-layout tensors and returns the kernel's outputs; the device
# launchers below call NKI, the references run the documented math in torch.
ForwardLauncher = Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
BackwardLauncher = Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]


def _routing(x: torch.Tensor, num_tokens_per_expert: torch.Tensor, block_size: int) -> BlockwiseRouting:
    return blockwise_routing(num_tokens_per_expert, num_rows=x.shape[0], block_size=block_size)


def nki_moe_forward_with(
    launch: ForwardLauncher,
    x: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    w3: torch.Tensor,
    num_tokens_per_expert: torch.Tensor,
    *,
    block_size: int = NKI_BLOCK_SIZE,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """torchtitan layouts -> kernel layouts -> ``launch`` -> ``(out [R, D], gate, up)``."""
    routing = _routing(x, num_tokens_per_expert, block_size)
    output, gate_up_T, _down_activations = launch(
        hidden_states=hidden_with_padding_row(x),
        expert_affinities_masked=row_expert_affinities(routing, w1.shape[0], x.dtype),
        gate_up_proj_weight=gate_up_from_w1_w3(w1, w3),
        down_proj_weight=down_from_w2(w2),
        token_position_to_id=routing.token_position_to_id,
        block_to_expert=routing.block_to_expert,
        block_size=block_size,
    )
    gate, up = block_gate_up_T_to_rows(gate_up_T, routing)
    return output[: x.shape[0]].contiguous(), gate, up


def nki_moe_backward_with(
    launch: BackwardLauncher,
    grad_out: torch.Tensor,
    x: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    w3: torch.Tensor,
    num_tokens_per_expert: torch.Tensor,
    gate: torch.Tensor,
    up: torch.Tensor,
    out: torch.Tensor,
    *,
    block_size: int = NKI_BLOCK_SIZE,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rebuild the kernel's checkpoints from saved rows, launch, convert grads back."""
    routing = _routing(x, num_tokens_per_expert, block_size)
    experts, dim = w1.shape[0], x.shape[1]
    # With affinity 1 the forward output of a row is its down-projection activation.
    down_activations = blocks_from_rows(out, routing).reshape(routing.num_blocks, block_size, dim)
    hidden_grad, _affinity_grad, gate_up_grad, down_grad = launch(
        hidden_states=hidden_with_padding_row(x),
        expert_affinities_masked=row_expert_affinities(routing, experts, x.dtype),
        gate_up_proj_weight=gate_up_from_w1_w3(w1, w3),
        down_proj_weight=down_from_w2(w2),
        gate_up_proj_act_checkpoint_T=rows_to_block_gate_up_T(gate, up, routing),
        down_proj_act_checkpoint=down_activations,
        token_position_to_id=routing.token_position_to_id,
        block_to_expert=routing.block_to_expert,
        output_hidden_states_grad=hidden_with_padding_row(grad_out),
        block_size=block_size,
    )
    grad_w1, grad_w3 = w1_w3_from_gate_up(gate_up_grad)
    return hidden_grad[: x.shape[0]].contiguous(), grad_w1, w2_from_down(down_grad), grad_w3


# --------------------------------------------------------------------------- device launchers
def _logical_neuron_cores() -> int:
    try:
        from torch_neuronx.utils import get_logical_neuron_cores
    except ImportError:
        return logical_neuron_cores()
    return int(get_logical_neuron_cores())


@functools.cache
def _launcher(call: NkiKernelCall, logical_cores: int) -> Any:
    """``wrap_nki(kernel)[grid]``, built once per kernel and LNC, since wrap_nki traces and registers
    the kernel on every call."""
    wrap_nki = _resolve("torch_neuronx", "wrap_nki")
    return wrap_nki(_resolve(call.module, call.name))[(logical_cores,)]


def _launch(call: NkiKernelCall, kernel_args: Mapping[str, Any]) -> Any:
    return _launcher(call, _logical_neuron_cores())(**{name: kernel_args[name] for name in call.arguments})


def _launch_moe_cte(**kernel_args: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """UNTESTED ON HARDWARE: moe_cte's shard_on_i kernel with activation checkpoints, affinity on H."""
    constants = {
        "checkpoint_activation": True,
        "expert_affinity_multiply_on_I": False,
        "expert_affinities_scaling_mode": _resolve(*POST_SCALE),
    }
    output, gate_up_T, down_activations = _launch(FORWARD_KERNEL, {**kernel_args, **constants})
    return output, gate_up_T, down_activations


def _launch_blockwise_mm_bwd(**kernel_args: Any) -> tuple[torch.Tensor, ...]:
    """UNTESTED ON HARDWARE: nki-library blockwise_mm_bwd (dropless, affinity on H)."""
    return tuple(_launch(BACKWARD_KERNEL, kernel_args)[:4])


def _nki_forward(
    x: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    w3: torch.Tensor,
    num_tokens_per_expert: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return nki_moe_forward_with(_launch_moe_cte, x, w1, w2, w3, num_tokens_per_expert)


def _nki_backward(
    grad_out: torch.Tensor,
    x: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    w3: torch.Tensor,
    num_tokens_per_expert: torch.Tensor,
    gate: torch.Tensor,
    up: torch.Tensor,
    out: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return nki_moe_backward_with(_launch_blockwise_mm_bwd, grad_out, x, w1, w2, w3, num_tokens_per_expert, gate, up, out)


def nki_op_factory(qualname: str, fn: Callable[..., Any]) -> Any:
    """Build the operator with ``torch_neuronx.nki_op``: ``fn`` is its own fake kernel.

    ``fn``'s annotations give the schema (they match the registry's schemas); this module avoids
    ``from __future__ import annotations`` so they are real types.
    """
    nki_op = _resolve("torch_neuronx", "nki_op")
    return nki_op(qualname, mutates_args=())(fn)


NKI = register_kernel(
    ExpertKernel("nki", _nki_forward, _nki_backward, probe=probe_nki, shape_check=check_nki_moe_shapes, make_op=nki_op_factory)
)


# --------------------------------------------------------------------------- references
def blockwise_moe_reference(
    *,
    hidden_states: torch.Tensor,
    expert_affinities_masked: torch.Tensor,
    gate_up_proj_weight: torch.Tensor,
    down_proj_weight: torch.Tensor,
    token_position_to_id: torch.Tensor,
    block_to_expert: torch.Tensor,
    block_size: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """moe_cte's documented forward (SiLU, POST_SCALE, no bias, activation checkpoints), in fp32."""
    rows_plus_one, dim = hidden_states.shape
    experts, _, _, hidden = gate_up_proj_weight.shape
    num_blocks = block_to_expert.shape[0]
    affinities = expert_affinities_masked.float().reshape(rows_plus_one, experts)
    output = torch.zeros(rows_plus_one, dim)
    gate_up_T = torch.zeros(num_blocks, 2, hidden, block_size)
    down_activations = torch.zeros(num_blocks, block_size, dim)
    for block in range(num_blocks):
        ids = token_position_to_id[block * block_size : (block + 1) * block_size].long()
        expert = int(block_to_expert[block, 0])
        gate_up = hidden_states[ids].float() @ gate_up_proj_weight[expert].float().reshape(dim, 2 * hidden)
        gate_up = gate_up.reshape(block_size, 2, hidden)
        gate_up_T[block] = gate_up.permute(1, 2, 0)
        down = (F.silu(gate_up[:, 0]) * gate_up[:, 1]) @ down_proj_weight[expert].float()
        down_activations[block] = down
        output.index_add_(0, ids, down * affinities[ids, expert].unsqueeze(1))
    dtype = hidden_states.dtype
    return output.to(dtype), gate_up_T.to(dtype), down_activations.to(dtype)


def blockwise_moe_backward_reference(
    *,
    hidden_states: torch.Tensor,
    expert_affinities_masked: torch.Tensor,
    gate_up_proj_weight: torch.Tensor,
    down_proj_weight: torch.Tensor,
    gate_up_proj_act_checkpoint_T: torch.Tensor,
    down_proj_act_checkpoint: torch.Tensor,
    token_position_to_id: torch.Tensor,
    block_to_expert: torch.Tensor,
    output_hidden_states_grad: torch.Tensor,
    block_size: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """blockwise_mm_bwd's documented gradients (affinity on H, dropless), in fp32."""
    rows_plus_one, dim = hidden_states.shape
    experts, _, _, hidden = gate_up_proj_weight.shape
    affinities = expert_affinities_masked.float().reshape(rows_plus_one, experts)
    hidden_grad = torch.zeros(rows_plus_one, dim)
    affinity_grad = torch.zeros(rows_plus_one, experts)
    gate_up_grad = torch.zeros(gate_up_proj_weight.shape)
    down_grad = torch.zeros(down_proj_weight.shape)
    for block in range(block_to_expert.shape[0]):
        ids = token_position_to_id[block * block_size : (block + 1) * block_size].long()
        expert = int(block_to_expert[block, 0])
        upstream = output_hidden_states_grad[ids].float()
        affinity_grad[ids, expert] += (upstream * down_proj_act_checkpoint[block].float()).sum(dim=1)
        grad_down_out = upstream * affinities[ids, expert].unsqueeze(1)
        gate, up = gate_up_proj_act_checkpoint_T[block].float().permute(2, 0, 1).unbind(1)
        sigmoid = torch.sigmoid(gate)
        silu = gate * sigmoid
        down_grad[expert] += (silu * up).t() @ grad_down_out
        grad_h = grad_down_out @ down_proj_weight[expert].float().t()
        grad_gate = grad_h * up * sigmoid * (1 + gate * (1 - sigmoid))
        grad_up = grad_h * silu
        x = hidden_states[ids].float()
        weights = gate_up_proj_weight[expert].float()
        gate_up_grad[expert, :, 0] += x.t() @ grad_gate
        gate_up_grad[expert, :, 1] += x.t() @ grad_up
        hidden_grad.index_add_(0, ids, grad_gate @ weights[:, 0].t() + grad_up @ weights[:, 1].t())
    dtype = hidden_states.dtype
    return (
        hidden_grad.to(dtype),
        affinity_grad.reshape(-1, 1).to(dtype),
        gate_up_grad.to(dtype),
        down_grad.to(dtype),
    )
