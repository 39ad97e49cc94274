"""Will it fit? A model of one training step per rank, the fit check, and ``parallelism=auto``
(docs/fit.md).

Sits below preflight and starts nothing: ``preflight`` estimates rank 0's memory and in
``mode=train`` refuses a run that would not fit; ``auto_layout`` chooses the degrees.
"""

from __future__ import annotations

import dataclasses

from qwen3_trn.common.errors import ConfigError
from qwen3_trn.config.schema import ParallelismConfig, RunConfig
from qwen3_trn.devices import DeviceSpec
from qwen3_trn.models.architecture import Qwen3Architecture
from qwen3_trn.run.fit.device_memory import (
    DEFAULT_ACCELERATOR,
    DeviceMemory,
    accelerator,
    device_memory,
)
from qwen3_trn.run.fit.estimate import StepModel, estimate
from qwen3_trn.run.fit.memory import GIB, MemoryEstimate
from qwen3_trn.run.fit.remedies import remedies
from qwen3_trn.run.fit.report import FitReport
from qwen3_trn.run.fit.solver import solve
from qwen3_trn.run.fit.vendor_layouts import check_vendor_layout, vendor_layouts
from qwen3_trn.run.layout import Layout
from qwen3_trn.titan import Trainer

__all__ = [
    "PLANNED_NODES",
    "FitReport",
    "MemoryEstimate",
    "assess",
    "auto_layout",
    "check_vendor_layout",
    "chosen_parallelism",
    "planned_ranks_per_node",
    "preflight",
    "refusal",
    "with_tracked",
]
# Device types whose node, when it is not on this machine, comes from the accelerator table.
PLANNED_NODES = tuple(DEFAULT_ACCELERATOR)


def _budget(cfg: RunConfig, device: DeviceSpec, layout: Layout) -> DeviceMemory:
    return device_memory(cfg.device, cfg.launcher, device, layout.nproc_per_node)


def _precision(model: StepModel) -> str:
    p = model.precision
    return f"master {p.master} (params, grads, AdamW states), compute {p.param}, gradient reduce {p.reduce}"


def assess(
    cfg: RunConfig,
    device: DeviceSpec,
    layout: Layout,
    arch: Qwen3Architecture,
    trainer_config: Trainer.Config,
    *,
    probe: bool,
    choice: str | None = None,
) -> tuple[FitReport, StepModel]:
    model = StepModel.of(cfg, device, arch, trainer_config)
    budget = _budget(cfg, device, layout)
    memory = estimate(model, layout, budget.per_rank, probe=probe)
    return FitReport(counts=model.counts, memory=memory, budget=budget, layout=layout, precision=_precision(model), choice=choice), model


def refusal(report: FitReport, model: StepModel, device: DeviceSpec) -> ConfigError:
    e = report.decisive
    lines = [
        f"rank 0 needs ~{e.total / GIB:.1f} GiB but one rank has {report.budget.describe()}; nothing was started.",
        f"  rank 0 of {report.layout.describe()}: {report.breakdown()} (estimate: {e.source})",
        f"  model: {report.model_line()}",
        "What would make it fit, most preferred first:",
        *(f"  {i}. {r.line(report.budget)}" for i, r in enumerate(remedies(model, report.layout, report.budget, device), 1)),
    ]
    return ConfigError("fit", "\n".join(lines))


def preflight(
    cfg: RunConfig, device: DeviceSpec, layout: Layout, arch: Qwen3Architecture, trainer_config: Trainer.Config, choice: str | None = None
) -> FitReport:
    """The fit of this run. In ``mode=train`` (and ``fit.check=true``) a run that does not fit is refused."""
    training = cfg.mode == "train"
    report, model = assess(cfg, device, layout, arch, trainer_config, probe=not training, choice=choice)
    if training and cfg.fit.check and not report.fits:
        raise refusal(report, model, device)
    return report


def with_tracked(report: FitReport, tracked: MemoryEstimate) -> FitReport:
    return dataclasses.replace(report, tracked=tracked)


def planned_ranks_per_node(cfg: RunConfig, device: DeviceSpec) -> int:
    """Ranks of one node of a device that is not on this machine (from the accelerator table)."""
    return accelerator(device.type, cfg.device.accelerator, cfg.launcher.env).per_node


def auto_layout(
    cfg: RunConfig, device: DeviceSpec, arch: Qwen3Architecture, trainer_config: Trainer.Config, nnodes: int, nproc_per_node: int
) -> tuple[Layout, str]:
    """The fitting layout of ``nnodes x nproc_per_node`` ranks that communicates least, among the
    vendor's layouts where the instance type has them."""
    model = StepModel.of(cfg, device, arch, trainer_config)
    budget = device_memory(cfg.device, cfg.launcher, device, nproc_per_node)
    return solve(model, nnodes, nproc_per_node, budget, vendor_layouts(cfg, device))


def chosen_parallelism(parallelism: ParallelismConfig, layout: Layout) -> ParallelismConfig:
    """The parallelism group with the chosen degrees written in, so every rank starts from the
    saved config's layout."""
    degrees = {name: getattr(layout, name) for name in ("dp_replicate", "dp_shard", "cp", "tp", "pp", "ep")}
    return dataclasses.replace(parallelism, auto=False, **degrees)


def tracked_section(report: FitReport, check: dict) -> str:
    """The fit table with the tracker's row from ``python -m qwen3_trn.rank --check``."""
    if "tracked" not in check:
        return f"the tracker could not run ({check.get('tracked_error')}); the estimate above stands"
    return with_tracked(report, MemoryEstimate.from_record(check["tracked"])).table()
