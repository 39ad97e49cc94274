"""What would make a step fit, most preferred first, each with its estimate (closed-form
activations, so a refused command answers within seconds).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from qwen3_trn.devices import DeviceSpec
from qwen3_trn.models.architecture import Qwen3Architecture
from qwen3_trn.run.fit.counts import count
from qwen3_trn.run.fit.device_memory import DeviceMemory, accelerator
from qwen3_trn.run.fit.estimate import StepModel
from qwen3_trn.run.fit.memory import GIB
from qwen3_trn.run.layout import Layout
from qwen3_trn.titan import qwen3_configs

MAX_RANKS = 8192
# A smoke run should leave room: cut until it needs at most this share of a rank's memory.
SMOKE_SHARE = 0.75


@dataclass(frozen=True)
class Remedy:
    text: str
    total: int | None = None

    def line(self, budget: DeviceMemory) -> str:
        if self.total is None:
            return self.text
        return f"{self.text}  (~{self.total / GIB:.1f} GiB per rank of {budget.per_rank / GIB:.1f})"


def _total(model: StepModel, layout: Layout) -> int:
    return model.estimate(layout, model.analytic(model.shape(layout)), "analytic").total


def _variant(model: StepModel, *, arch=None, **training) -> StepModel:
    cfg = model.cfg
    if training:
        cfg = dataclasses.replace(cfg, training=dataclasses.replace(cfg.training, **training))
    if arch is None:
        return dataclasses.replace(model, cfg=cfg)
    return dataclasses.replace(model, cfg=cfg, arch=arch, counts=count(cfg.model.flavor, arch, cfg.training.seq_len))


def _fsdp(nnodes: int, per_node: int, world: int) -> Layout:
    return Layout(nnodes=nnodes, nproc_per_node=per_node, dp_replicate=1, dp_shard=world, cp=1, tp=1, pp=1, ep=1)


def more_ranks(model: StepModel, layout: Layout, budget: DeviceMemory, device: DeviceSpec) -> Remedy | None:
    if device.type == "cpu":
        return None  # a host's ranks share its RAM: more of them on one host need more of it, not less
    per_node = device.count or accelerator(device.type, model.cfg.device.accelerator, model.cfg.launcher.env).per_node
    world = layout.world_size * 2
    while world <= MAX_RANKS:
        nodes, per = (1, world) if world <= per_node else (math.ceil(world / per_node), per_node)
        if nodes * per == world:
            total = _total(model, _fsdp(nodes, per, world))
            if total <= budget.per_rank:
                where = f"launcher.nproc_per_node={per}" + (f" launcher.nnodes={nodes}" if nodes > 1 else "")
                return Remedy(f"more ranks: FSDP over {world} ranks: {where} parallelism.dp_shard=-1 (or parallelism=auto)", total)
        world *= 2
    return None


def activation_checkpointing(model: StepModel, layout: Layout) -> Remedy | None:
    if model.cfg.training.activation_checkpoint == "full":
        return None
    return Remedy(
        "recompute activations: training.activation_checkpoint=full", _total(_variant(model, activation_checkpoint="full"), layout)
    )


def smaller_batch(model: StepModel, layout: Layout) -> Remedy | None:
    if model.cfg.training.local_batch_size <= 1:
        return None
    return Remedy("a smaller batch per rank: training.local_batch_size=1", _total(_variant(model, local_batch_size=1), layout))


def preset(model: StepModel, layout: Layout, budget: DeviceMemory, device: DeviceSpec) -> list[Remedy]:
    """The largest torchtitan flavor of the same kind that fits here, and planning for the target."""
    found = []
    kind = model.arch.is_moe
    fitting = []
    for flavor in qwen3_configs:
        arch = Qwen3Architecture.of_flavor(flavor)
        if arch.is_moe != kind or arch.max_seq_len < model.cfg.training.seq_len or _size(arch) >= _size(model.arch):
            continue
        variant = _variant(model, arch=arch)
        total = _total(variant, layout)
        if total <= budget.per_rank:
            fitting.append((variant.counts.total, flavor, total))
    if fitting:
        _, flavor, total = max(fitting)
        found.append(Remedy(f"a model preset that fits here: model={flavor}", total))
    if device.type == "cpu":
        found.append(
            Remedy(
                "plan it for its target instead: device=neuron parallelism=auto mode=check "
                "(a trn2.48xlarge, 64 ranks; or device=cuda device.accelerator=h100 launcher.nproc_per_node=8)"
            )
        )
    return found


def _size(arch: Qwen3Architecture) -> int:
    """A rough size, only to skip counting flavors larger than the one refused."""
    ffn = 3 * arch.dim * (arch.num_experts * arch.moe_hidden_dim if arch.is_moe else arch.hidden_dim)
    return arch.n_layers * (4 * arch.dim * arch.n_heads * arch.head_dim + ffn) + arch.vocab_size * arch.dim


def smoke_run(model: StepModel, layout: Layout, budget: DeviceMemory) -> Remedy | None:
    """The deepest cut of the model that fits (with fewer experts if one block is too big)."""
    arch = model.arch
    experts = arch.num_experts
    target = budget.per_rank * SMOKE_SHARE
    while True:
        cut = {"n_layers": 1}
        if arch.is_moe:
            cut.update(num_experts=experts, top_k=min(arch.top_k, experts))
        one = _variant(model, arch=dataclasses.replace(arch, **cut))
        total_one = _total(one, layout)
        if total_one <= target or not arch.is_moe or experts <= 1:
            break
        experts //= 2
    if total_one > target:
        return None
    two = _variant(model, arch=dataclasses.replace(one.arch, n_layers=2))
    per_layer = max(_total(two, layout) - total_one, 1)
    layers = min(arch.n_layers - 1, 1 + int((target - total_one) // per_layer))
    if layers < 1:
        return None
    overrides = f"model.n_layers={layers}"
    if arch.is_moe and experts != arch.num_experts:
        overrides += f" model.num_experts={experts} model.top_k={min(arch.top_k, experts)}"
    return Remedy(f"a cut of this model for a smoke run: {overrides}", total_one + per_layer * (layers - 1))


def remedies(model: StepModel, layout: Layout, budget: DeviceMemory, device: DeviceSpec) -> list[Remedy]:
    """Remedies that make it fit, in the order of preference, then the ones that always apply."""
    found = [
        more_ranks(model, layout, budget, device),
        activation_checkpointing(model, layout),
        smaller_batch(model, layout),
        *preset(model, layout, budget, device),
        smoke_run(model, layout, budget),
    ]
    useful = [r for r in found if r is not None and (r.total is None or r.total <= budget.per_rank)]
    return [
        *useful,
        Remedy("see the full breakdown without starting anything: mode=plan"),
        Remedy("start anyway (it may run out of memory): fit.check=false"),
    ]
