"""Rank 0's memory composed from torchtitan's parameter shapes, the layout and measured
activations (``fit.probe``, else ``fit.analytic``). Sharding follows torchtitan's: docs/fit.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch.distributed.pipelining.schedules import (
    PipelineScheduleSingle,
    get_schedule_class,
)

from qwen3_trn.run.fit.counts import ROUTER, ModelCounts, Parameter
from qwen3_trn.run.fit.memory import MemoryEstimate
from qwen3_trn.run.fit.probe import ActivationProfile
from qwen3_trn.run.layout import Layout

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
ADAMW_STATES = 2  # exp_avg, exp_avg_sq, each the size and dtype of the parameter shard
# torchtitan's FSDP units (apply_fsdp_to_decoder): each block, norm with lm_head (the "head", which
# never reshards after forward unless the policy is "always"), and the embedding; a tied embedding
# joins the head's unit.
HEAD_UNIT = "norm and lm_head"
FSDP_UNIT = {"norm": HEAD_UNIT, "lm_head": HEAD_UNIT}
TIED_FSDP_UNIT = {**FSDP_UNIT, "tok_embeddings": HEAD_UNIT}


@dataclass(frozen=True)
class Precision:
    """The run's dtypes: master (sharded params, grads, optimizer states), FSDP's param dtype
    (gathered weights, activations) and its reduce dtype (gradient reduce-scatter)."""

    master: str
    param: str
    reduce: str = "float32"


@dataclass(frozen=True)
class StepShape:
    """What one rank computes per step: micro-batches of ``micro_batch x seq_len`` tokens."""

    micro_batch: int
    seq_len: int
    # Micro-batches whose activations rank 0 holds at once (pipeline warm-up), 1 without PP.
    in_flight: int
    # FSDP keeps blocks unsharded between forward and backward (torchtitan's default under PP).
    keeps_unsharded: bool
    # Gradients exist while the activations peak (the end of forward): torchtitan zero-fills them
    # between steps where CUDA graphs may replay (zero_grad(set_to_none=False)), and a later
    # micro-batch (pipeline, gradient accumulation) runs forward while earlier ones' are held.
    # Otherwise they are None until backward makes them.
    grads_at_activation_peak: bool = True
    # Reduce-dtype buffers of a unit's size that FSDP's reduce holds at one rank besides the
    # gradient shards: the reduce-scatter input and the ``grads / divide_factor`` temporary it
    # copies from. The CPU adapter (qwen3_trn/devices/cpu.py) unsets the factor and makes the
    # input the gradients' own storage, so none there.
    one_rank_reduce_buffers: int = 2


def step_shape(
    layout: Layout,
    local_batch: int,
    seq_len: int,
    pp_schedule: str,
    pp_micro_batch: int,
    reshard_after_forward: str,
    global_batch: int = -1,
    grads_set_to_none: bool = False,
    device_type: str = "cuda",
) -> StepShape:
    micro_batch = pp_micro_batch if layout.pp > 1 else local_batch
    in_flight = 1
    if layout.pp > 1:
        micro_batches = max(local_batch // pp_micro_batch, 1)
        single_stage = issubclass(get_schedule_class(pp_schedule), PipelineScheduleSingle)
        # 1F1B: the first stage runs pp forwards before its first backward; others hold them all.
        in_flight = min(micro_batches, layout.pp) if single_stage and pp_schedule == "1F1B" else micro_batches
    keeps = reshard_after_forward == "never" or (reshard_after_forward == "default" and layout.pp > 1)
    accumulates = global_batch > local_batch * layout.dp_replicate * layout.dp_shard
    return StepShape(
        micro_batch=micro_batch,
        seq_len=seq_len // layout.cp,
        in_flight=in_flight,
        keeps_unsharded=keeps,
        grads_at_activation_peak=not grads_set_to_none or layout.pp > 1 or accumulates,
        one_rank_reduce_buffers=0 if device_type == "cpu" else 2,
    )


def local_numel(parameter: Parameter, layout: Layout) -> int:
    """Elements of ``parameter`` on one rank."""
    fsdp = layout.dp_shard * layout.cp
    if parameter.is_routed_expert:
        return math.ceil(parameter.numel / (fsdp * layout.tp))
    tp = layout.tp if len(parameter.shape) > 1 and ROUTER not in parameter.fqn else 1
    rows = parameter.shape[0]
    per_row = parameter.numel // rows
    if tp > 1:
        return math.ceil(math.ceil(parameter.numel / tp) / fsdp)
    return math.ceil(rows / fsdp) * per_row


def unsharded_numel(parameter: Parameter, layout: Layout) -> int:
    """Elements of ``parameter`` FSDP all-gathers on one rank (TP and EP shards stay split)."""
    if parameter.is_routed_expert:
        return parameter.numel // (layout.ep if layout.ep > 1 else layout.tp)
    tp = layout.tp if len(parameter.shape) > 1 and ROUTER not in parameter.fqn else 1
    return parameter.numel // tp


def composed_estimate(
    counts: ModelCounts,
    layout: Layout,
    modules: set[str],
    precision: Precision,
    shape: StepShape,
    activations: ActivationProfile,
    layers_on_rank: int,
    margin,
    source: str,
) -> MemoryEstimate:
    mine = [p for p in counts.parameters if p.module in modules]
    shard = sum(local_numel(p, layout) for p in mine)
    master, param, reduce = (DTYPE_BYTES[d] for d in (precision.master, precision.param, precision.reduce))
    buffers = sum(b.numel * b.itemsize for b in counts.buffers if b.module in modules)
    params, grads, optimizer = shard * master + buffers, shard * master, ADAMW_STATES * shard * master
    tied = not any(p.module == "lm_head" for p in counts.parameters)
    unit_of = TIED_FSDP_UNIT if tied else FSDP_UNIT
    units: dict[str, int] = {}
    for p in mine:
        units[unit_of.get(p.module, p.module)] = units.get(unit_of.get(p.module, p.module), 0) + unsharded_numel(p, layout)
    largest = max(units.values(), default=0)
    block = max((n for name, n in units.items() if name.startswith("layers.")), default=0)
    head = units.get(HEAD_UNIT, 0)
    head_shard = sum(local_numel(p, layout) for p in mine if unit_of.get(p.module) == HEAD_UNIT) * master
    one_rank = layout.dp_shard * layout.cp == 1
    reduce_buffers = shape.one_rank_reduce_buffers if one_rank else 1
    act = activations.per_layer * layers_on_rank * shape.in_flight + activations.fixed
    act = act // layout.tp

    # The two ends of backward bound its peak: backward trades each block's saved activations for
    # its gradient shard, so what it holds is linear in the blocks done (FSDPMemTracker over
    # torchtitan's rank 0 shows the peak at one of them).
    # 1. End of forward / the loss (torchtitan's chunked loss runs lm_head forward and backward per
    #    chunk): every activation saved. Without held gradients only the head's exist: FSDP's
    #    post-backward reduces them after every chunk, before any block's backward. Unsharded: the
    #    units kept through forward (all of them under reshard "never" or PP), the head (its unit
    #    never reshards after forward unless "always", and is re-gathered for the loss if it does),
    #    the head's gradient accumulating in the param dtype and its reduce-scatter input in the
    #    reduce dtype. Across ranks FSDP frees a block's all-gather output in forward only after the
    #    next unit's copy-out, so the last block's is still held at the end of forward; resharded
    #    blocks: the head's pre-backward prefetches the last block.
    kept = sum(units.values()) if shape.keeps_unsharded else head
    forward_end_fsdp = kept * param + head * (param + reduce_buffers * reduce)
    if not one_rank:
        forward_end_fsdp += block * param
    if not shape.keeps_unsharded:
        forward_end_fsdp += block * param
    forward_end_grads = grads if shape.grads_at_activation_peak else head_shard
    forward_end = params + optimizer + forward_end_grads + act + forward_end_fsdp
    # 2. Backward of the first block, the last to run: every gradient (conservatively its own too),
    #    one block's activations and what is not per block. FSDP reshards every unit after its
    #    backward, whatever reshard_after_forward says, so only this block is unsharded: its weights,
    #    its reduce-scatter input and the next unit's all-gather prefetched. Across ranks FSDP2
    #    also keeps the previous block's reduce-scatter input until the next one is issued (torch's
    #    tracker, whose fake collectives complete at once, does not see it).
    backward_end_act = (activations.per_layer * shape.in_flight + activations.fixed) // layout.tp
    backward_end_fsdp = largest * (2 * param + reduce_buffers * reduce)
    if not one_rank:
        backward_end_fsdp += largest * reduce
    backward_end = params + optimizer + grads + backward_end_act + backward_end_fsdp
    at_forward_end = forward_end >= backward_end
    peak = max(forward_end, backward_end)
    act, fsdp_buffers = (act, forward_end_fsdp) if at_forward_end else (backward_end_act, backward_end_fsdp)
    grads_at_peak = forward_end_grads if at_forward_end else grads
    return MemoryEstimate(
        params=params,
        grads=grads,
        optimizer=optimizer,
        activations=act,
        fsdp_buffers=fsdp_buffers,
        peak=peak,
        margin=margin(peak),
        source=source,
        detail={
            "layers_on_rank0": layers_on_rank,
            "micro_batches_in_flight": shape.in_flight,
            "activation_bytes_per_layer": activations.per_layer,
            "activation_bytes_fixed": activations.fixed,
            "peak_at": "end of forward (all activations saved)" if at_forward_end else "backward of the first block (all gradients)",
            "grads_at_peak": grads_at_peak,
        },
    )
