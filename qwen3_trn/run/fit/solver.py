"""``parallelism=auto``: the layout of the given ranks that fits and communicates least.

Ranking (docs/fit.md): FSDP, with expert parallel for MoE, first; tensor parallel only where that
fits nowhere (its collectives sit on every block's critical path); pipeline stages last (their
bubble idles every rank); within a tier, by bytes a rank sends per step, weighted by link.

Bytes per rank and step (P: parameters a rank gathers, T: its tokens, d: model dim): FSDP
all-gathers P twice in the param dtype and reduce-scatters gradients in fp32; routed experts
are gathered over ``efsdp = dp_shard x tp / ep``; replicas all-reduce gradient shards; TP moves
8 T d per block, EP 4 T top_k d per MoE block. A group spanning nodes costs ``INTER_NODE`` times
more per byte. A ranking heuristic, not a runtime prediction.
"""

from __future__ import annotations

from dataclasses import dataclass

from qwen3_trn.common.errors import ConfigError
from qwen3_trn.run.fit.composed import DTYPE_BYTES, unsharded_numel
from qwen3_trn.run.fit.device_memory import DeviceMemory
from qwen3_trn.run.fit.estimate import StepModel, estimate
from qwen3_trn.run.fit.layers import rank0_stages
from qwen3_trn.run.fit.memory import GIB, MemoryEstimate
from qwen3_trn.run.fit.vendor_layouts import VendorLayouts
from qwen3_trn.run.layout import Layout

INTER_NODE = 8.0


@dataclass(frozen=True)
class Candidate:
    layout: Layout
    memory: MemoryEstimate
    # Weighted bytes a rank moves per step (see the module docstring).
    communication: float

    def key(self) -> tuple:
        """FSDP (with expert parallel for MoE), then tensor parallel, then pipeline stages, each only
        where the one before fits nowhere; least communication within."""
        return (self.layout.pp > 1, self.layout.tp > 1, self.communication, self.layout.ep)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def candidate_layouts(model: StepModel, nnodes: int, nproc_per_node: int) -> list[Layout]:
    arch, training = model.arch, model.cfg.training
    micro_batch = model.cfg.parallelism.pp_microbatch_size
    world = nnodes * nproc_per_node
    layouts = []
    for tp in _divisors(nproc_per_node):
        if arch.n_heads % tp or arch.n_kv_heads % tp or training.seq_len % tp:
            continue
        for pp in _divisors(world // tp):
            micro_batches = training.local_batch_size // micro_batch if training.local_batch_size % micro_batch == 0 else 0
            # torchtitan refuses pipelines of models with tied embeddings
            if pp > 1 and (micro_batches < pp or pp > arch.n_layers or arch.tie_embeddings):
                continue
            data_parallel = world // (tp * pp)
            for dp_replicate in _divisors(nnodes) if nnodes > 1 else [1]:
                if data_parallel % dp_replicate:
                    continue
                dp_shard = data_parallel // dp_replicate
                experts = [ep for ep in _divisors(dp_shard) if arch.num_experts % ep == 0] if arch.is_moe else [1]
                for ep in experts:
                    layouts.append(
                        Layout(
                            nnodes=nnodes,
                            nproc_per_node=nproc_per_node,
                            dp_replicate=dp_replicate,
                            dp_shard=dp_shard,
                            cp=1,
                            tp=tp,
                            pp=pp,
                            ep=ep,
                        )
                    )
    return layouts


def communication(model: StepModel, layout: Layout) -> float:
    arch, training = model.arch, model.cfg.training
    param = DTYPE_BYTES[model.precision.param]
    reduce = DTYPE_BYTES[model.precision.reduce]
    stages = rank0_stages(model.trainer_config.parallelism, layout.pp, arch.n_layers)
    modules = {name for stage in stages for name in stage}
    mine = [p for p in model.counts.parameters if p.module in modules]
    dense = sum(unsharded_numel(p, layout) for p in mine if not p.is_routed_expert)
    experts = sum(unsharded_numel(p, layout) for p in mine if p.is_routed_expert)
    blocks = sum(1 for name in modules if name.startswith("layers."))
    tokens = training.local_batch_size * training.seq_len // layout.cp
    fsdp = layout.dp_shard * layout.cp
    efsdp = fsdp * layout.tp // layout.ep
    node = layout.nproc_per_node

    def link(span: int) -> float:
        return INTER_NODE if span > node else 1.0

    def gathered(n: int, group: int) -> float:
        return n * (2 * param + reduce) * (group - 1) / group

    total = gathered(dense, fsdp) * link(fsdp * layout.tp)
    total += gathered(experts, efsdp) * link(efsdp * layout.ep)
    if layout.dp_replicate > 1:
        shard = (dense / fsdp + experts / efsdp) * reduce
        total += 2 * shard * (layout.dp_replicate - 1) / layout.dp_replicate * link(fsdp * layout.tp * layout.dp_replicate)
    if layout.tp > 1:
        total += blocks * 8 * tokens * arch.dim * param * (layout.tp - 1) / layout.tp * link(layout.tp)
    if layout.ep > 1 and arch.is_moe:
        total += blocks * 4 * tokens * arch.top_k * arch.dim * param * (layout.ep - 1) / layout.ep * link(layout.ep)
    if layout.pp > 1:
        total += 2 * tokens * arch.dim * param * link(layout.world_size)
    return total


def _name(layout: Layout) -> str:
    parts = [f"{name}={getattr(layout, name)}" for name in ("dp_replicate", "dp_shard", "tp", "pp", "ep") if getattr(layout, name) > 1]
    return ", ".join(parts) or "one rank"


def candidates(
    model: StepModel, nnodes: int, nproc_per_node: int, budget: DeviceMemory, rules: VendorLayouts | None = None
) -> list[Candidate]:
    """Every layout torchtitan accepts (only the vendor's where ``rules`` is given), estimated."""
    found = []
    for layout in candidate_layouts(model, nnodes, nproc_per_node):
        if rules is not None and not rules.admits(layout):
            continue
        memory = estimate(model, layout, budget.per_rank, probe=False)
        found.append(Candidate(layout=layout, memory=memory, communication=communication(model, layout)))
    return found


def solve(
    model: StepModel, nnodes: int, nproc_per_node: int, budget: DeviceMemory, rules: VendorLayouts | None = None
) -> tuple[Layout, str]:
    """The chosen layout and why, in words. ``rules``: the vendor's layouts, then the only candidates."""
    every = candidates(model, nnodes, nproc_per_node, budget, rules)
    world = nnodes * nproc_per_node
    if not every:
        raise ConfigError(
            "parallelism",
            f"parallelism=auto on {rules.instance} picks only the layouts AWS runs there ({rules.describe()}), and none of "
            f"them suits {world} ranks of this model (tensor parallel must divide the ranks of a node and the attention heads); "
            "give the degrees explicitly (parallelism.tp, parallelism.dp_shard) or run AWS's layout's number of ranks.",
        )
    fitting = sorted((c for c in every if c.memory.total <= budget.per_rank), key=Candidate.key)
    if not fitting:
        best = min(every, key=lambda c: c.memory.total)
        raise ConfigError(
            "parallelism",
            f"parallelism=auto found no layout of {world} ranks that fits: the smallest estimate is "
            f"{best.memory.total / GIB:.1f} GiB per rank ({_name(best.layout)}) against {budget.describe()}. "
            "Add ranks (launcher.nproc_per_node / launcher.nnodes), set training.activation_checkpoint=full, "
            "lower training.local_batch_size, or pick a smaller model; mode=plan shows the breakdown.",
        )
    chosen = fitting[0]
    headroom = (budget.per_rank - chosen.memory.total) / GIB
    tier = "pipeline stages" if chosen.layout.pp > 1 else "tensor parallel" if chosen.layout.tp > 1 else "FSDP"
    needed = {"FSDP": "", "tensor parallel": " (no layout without it fits)", "pipeline stages": " (no layout without them fits)"}[tier]
    if rules is not None:
        tier, needed = f"AWS's layouts on {rules.instance}", ""
    reason = (
        f"{_name(chosen.layout)}: {len(fitting)} of {len(every)} layouts of {world} ranks fit; among {'those with ' if rules is None else ''}"
        f"{tier}{needed} this one moves the fewest bytes per rank and step (~{chosen.communication / 1e9:.3g} GB, "
        f"heuristic); headroom {headroom:.1f} GiB per rank"
    )
    if rules is not None:  # FSDP alone is not among the vendor's layouts
        return chosen.layout, f"{reason}; AWS's layouts: {rules.describe()}"
    plain = next((c for c in fitting if (c.layout.tp, c.layout.pp, c.layout.ep, c.layout.dp_replicate) == (1, 1, 1, 1)), None)
    if plain is not None and plain is not chosen:
        reason += f"; FSDP alone fits too but moves ~{plain.communication / 1e9:.3g} GB"
    elif plain is None:
        reason += "; FSDP alone does not fit"
    return chosen.layout, reason
