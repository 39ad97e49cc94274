"""NKI implementation of ``moe_swiglu_experts`` on Trainium, via nki-library's blockwise kernels.

UNTESTED ON HARDWARE. This file is written against the documented APIs of torch-neuronx and
nki-library and has never run on a Neuron device; nothing here is imported unless the ``nki``
kernel is selected. What *is* tested on CPU is everything around the kernel launches — the
layout conversions in and out of the kernels — by running this module's plumbing with
:func:`blockwise_moe_reference`/:func:`blockwise_moe_backward_reference` (pure-torch ports of
the kernels' documented semantics) in place of the device launches.

APIs used (all imported lazily):

* ``torch_neuronx.nki_op(name, mutates_args=...)``: wraps ``torch.library.custom_op``; the
  function is its own fake kernel (the NKI launch has fake-tensor shape inference), so the
  function body below must only do static-shape work. Autograd is attached with
  ``op.register_autograd(...)`` by the registry, using the shared formula of
  :mod:`qwen3_trn.kernels.moe`.
* ``torch_neuronx.wrap_nki(kernel)[grid](*args)``: launches an ``@nki.jit`` kernel on Neuron
  tensors; the grid is the logical NeuronCore count (LNC).
* ``nkilib.core.moe.moe_cte.moe_cte`` (forward, ``shard_on_i`` with ``checkpoint_activation``,
  which returns ``(output, gate_up_activations_T [N, 2, I, B], down_activations [N, B, H])``)
  and ``nkilib.experimental.moe.bwd.blockwise_mm_backward.blockwise_mm_bwd`` (backward,
  returns ``(hidden_grad, affinity_grad, gate_up_grad, down_grad)``).
  ``nkilib.core.moe.moe_cte.moe_cte_torch.moe_cte_torch_ref`` is nki-library's own torch
  reference of the forward.

Routed rows are passed as the kernel's "tokens" with affinity 1 for their own expert, so the
kernel computes torchtitan's per-row expert MLP; see :mod:`qwen3_trn.kernels.layouts`.
"""

import importlib
import os
from collections.abc import Callable, Mapping
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
from .moe import MOE_SWIGLU_EXPERTS, MOE_SWIGLU_EXPERTS_BACKWARD
from .registry import OpDeclaration, register_kernel

__all__ = [
    "NKI_BLOCK_SIZE",
    "NKI_REQUIRED_MODULES",
    "blockwise_moe_backward_reference",
    "blockwise_moe_reference",
    "check_nki_moe_shapes",
    "nki_moe_backward_with",
    "nki_moe_forward_with",
    "probe_nki",
]

# Tokens per block. moe_cte's shard_on_i needs a multiple of 256; blockwise_mm_bwd accepts
# 128/256/512/1024. 256 is the smallest size both accept.
NKI_BLOCK_SIZE = 256
NKI_REQUIRED_MODULES = ("torch_neuronx", "nki", "nkilib")
_INSTALL_HINT = (
    "The nki kernel needs a Trainium host with the AWS Neuron SDK: torch-neuronx (which brings "
    "nki) and nki-library (nkilib). Install them from the Neuron pip repository, or use "
    "backend.kernels=portable (or backend.kernels=auto) to run a portable kernel."
)


def probe_nki() -> str | None:
    """None when the NKI stack imports, else which import failed and how to fix it."""
    for module in NKI_REQUIRED_MODULES:
        try:
            importlib.import_module(module)
        except Exception as exc:  # noqa: BLE001 - any import failure makes NKI unusable
            return f"import {module} failed ({type(exc).__name__}: {exc}). {_INSTALL_HINT}"
    return None


def check_nki_moe_shapes(problem: Mapping[str, int]) -> str | None:
    """The shape constraints documented by moe_cte (shard_on_i) and blockwise_mm_bwd.

    H (= dim) in [512, 8192] and a multiple of 512 (forward); I (= hidden_dim) a multiple of 16
    (forward) whose half over 2 logical cores stays a multiple of 32 (backward DMA transpose).
    """
    dim, hidden_dim = problem["dim"], problem["hidden_dim"]
    failures = []
    if not (512 <= dim <= 8192 and dim % 512 == 0):
        failures.append(f"dim={dim} must be a multiple of 512 in [512, 8192]")
    if hidden_dim % 64:
        failures.append(f"hidden_dim={hidden_dim} must be a multiple of 64")
    return "; ".join(failures) or None


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
        return int(os.environ.get("NEURON_LOGICAL_NC_CONFIG", "2"))
    return int(get_logical_neuron_cores())


# Positional order of the kernels' documented signatures.
_MOE_CTE_ARGS = (
    "hidden_states",
    "expert_affinities_masked",
    "gate_up_proj_weight",
    "down_proj_weight",
    "token_position_to_id",
    "block_to_expert",
    "block_size",
)
_BLOCKWISE_MM_BWD_ARGS = (
    "hidden_states",
    "expert_affinities_masked",
    "gate_up_proj_weight",
    "down_proj_weight",
    "gate_up_proj_act_checkpoint_T",
    "down_proj_act_checkpoint",
    "token_position_to_id",
    "block_to_expert",
    "output_hidden_states_grad",
    "block_size",
)


def _launch_moe_cte(**kernel_args: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """UNTESTED ON HARDWARE: nki-library moe_cte, shard_on_i, with activation checkpoints."""
    from nkilib.core.moe.moe_cte.moe_cte import MoECTEImplementation, MoECTESpec, ShardOnIConfig, moe_cte
    from torch_neuronx import wrap_nki

    spec = MoECTESpec(
        implementation=MoECTEImplementation.shard_on_i,
        shard_on_I=ShardOnIConfig(checkpoint_activation=True, expert_affinity_multiply_on_I=False),
    )
    args = [kernel_args[name] for name in _MOE_CTE_ARGS]
    return wrap_nki(moe_cte)[_logical_neuron_cores()](*args, spec)


def _launch_blockwise_mm_bwd(**kernel_args: Any) -> tuple[torch.Tensor, ...]:
    """UNTESTED ON HARDWARE: nki-library blockwise_mm_bwd (dropless, affinity on H)."""
    from nkilib.experimental.moe.bwd.blockwise_mm_backward import blockwise_mm_bwd
    from torch_neuronx import wrap_nki

    args = [kernel_args[name] for name in _BLOCKWISE_MM_BWD_ARGS]
    outputs = wrap_nki(blockwise_mm_bwd)[_logical_neuron_cores()](*args)
    return tuple(outputs[:4])


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


def nki_op_factory(qualname: str, fn: Callable[..., Any], decl: OpDeclaration) -> Any:
    """Build the operator with ``torch_neuronx.nki_op``: ``fn`` is its own fake kernel.

    ``fn``'s annotations give the schema (they match ``decl.schema``); this module avoids
    ``from __future__ import annotations`` so they are real types.
    """
    from torch_neuronx import nki_op

    return nki_op(qualname, mutates_args=())(fn)


_NKI_PRIORITY = 100  # above every portable kernel: auto prefers NKI wherever it can run

register_kernel(
    MOE_SWIGLU_EXPERTS.name,
    "nki",
    devices=("neuron",),
    available=probe_nki,
    priority=_NKI_PRIORITY,
    portable=False,
    shape_check=check_nki_moe_shapes,
    op_factory=nki_op_factory,
)(_nki_forward)
register_kernel(
    MOE_SWIGLU_EXPERTS_BACKWARD.name,
    "nki",
    devices=("neuron",),
    available=probe_nki,
    priority=_NKI_PRIORITY,
    portable=False,
    shape_check=check_nki_moe_shapes,
    op_factory=nki_op_factory,
)(_nki_backward)


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
