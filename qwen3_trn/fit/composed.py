"""Rank 0's memory composed from torchtitan's parameter shapes, the layout, and measured activations.

Parameters, gradients and AdamW states follow from every parameter's shape and how torchtitan
shards it: FSDP over ``dp_shard x cp`` (padded on dim 0), tensor parallel over ``tp`` for
matrices, routed experts over ``ep x efsdp = dp_shard x cp x tp``, pipeline stages split as
torchtitan splits them; ``dp_replicate`` copies. Their dtype is the master dtype
(``training.dtype``); FSDP all-gathers a block in the mixed-precision param dtype and
reduce-scatters its gradients in fp32. Activations per micro-batch come from the probe
(``fit.probe``: MemTracker on torchtitan's own model) or, where that cannot run, from a closed
form (``fit.analytic``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch.distributed.pipelining.schedules import (
    PipelineScheduleSingle,
    get_schedule_class,
)

from qwen3_trn.fit.counts import ROUTER, ModelCounts, Parameter
from qwen3_trn.fit.memory import MemoryEstimate
from qwen3_trn.fit.probe import ActivationProfile
from qwen3_trn.layout import Layout

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
ADAMW_STATES = 2  # exp_avg, exp_avg_sq, each the size and dtype of the parameter shard
# torchtitan's FSDP units (apply_fsdp_to_decoder): the embedding, each block, norm with lm_head.
FSDP_UNIT = {"norm": "norm and lm_head", "lm_head": "norm and lm_head"}


@dataclass(frozen=True)
class Precision:
    """The run's dtypes: master (sharded params, grads, optimizer states), FSDP's param dtype
    (all-gathered weights, activations) and its reduce dtype (reduce-scatter of gradients)."""

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


def step_shape(
    layout: Layout, local_batch: int, seq_len: int, pp_schedule: str, pp_micro_batch: int, reshard_after_forward: str
) -> StepShape:
    micro_batch = pp_micro_batch if layout.pp > 1 else local_batch
    in_flight = 1
    if layout.pp > 1:
        micro_batches = max(local_batch // pp_micro_batch, 1)
        single_stage = issubclass(get_schedule_class(pp_schedule), PipelineScheduleSingle)
        # 1F1B: the first stage runs pp forwards before its first backward; others hold them all.
        in_flight = min(micro_batches, layout.pp) if single_stage and pp_schedule == "1F1B" else micro_batches
    keeps = reshard_after_forward == "never" or (reshard_after_forward == "default" and layout.pp > 1)
    return StepShape(micro_batch=micro_batch, seq_len=seq_len // layout.cp, in_flight=in_flight, keeps_unsharded=keeps)


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
    if tied and layout.dp_shard * layout.cp == 1:
        # Measured (torch's tracker and its allocator agree): with a single FSDP rank the tied
        # embedding/lm_head weight holds a second gradient of its size.
        grads += sum(local_numel(p, layout) for p in mine if p.module == "tok_embeddings") * master
    units: dict[str, int] = {}
    for p in mine:
        units[FSDP_UNIT.get(p.module, p.module)] = units.get(FSDP_UNIT.get(p.module, p.module), 0) + unsharded_numel(p, layout)
    largest = max(units.values(), default=0)
    # Backward of one block: its weights all-gathered, its reduce-scatter input, and the next
    # block's all-gather prefetched. Across ranks FSDP2 also keeps the previous block's
    # reduce-scatter input until the next one is issued (torch's tracker, whose fake
    # collectives complete at once, does not see it).
    fsdp_buffers = largest * (2 * param + reduce)
    if layout.dp_shard * layout.cp > 1:
        fsdp_buffers += largest * reduce
    if shape.keeps_unsharded:
        fsdp_buffers += sum(units.values()) * param
    act = activations.per_layer * layers_on_rank * shape.in_flight + activations.fixed
    act = act // layout.tp
    peak = params + grads + optimizer + act + fsdp_buffers
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
        },
    )
