"""One training step of a config and layout: counts, rank 0's memory, and which model said so.

Activations come from the probe, or from the closed form where that cannot change the answer
or the probe cannot run; ``mode=check`` replaces the figures with the tracker's (``fit.tracked``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from qwen3_trn.common.errors import ConfigError
from qwen3_trn.config.schema import RunConfig
from qwen3_trn.models.architecture import Qwen3Architecture
from qwen3_trn.models.qwen3 import build_model_config
from qwen3_trn.run.convert import compute_dtype, param_dtype
from qwen3_trn.run.fit.analytic import analytic_profile
from qwen3_trn.run.fit.composed import (
    DTYPE_BYTES,
    Precision,
    StepShape,
    composed_estimate,
    step_shape,
)
from qwen3_trn.run.fit.counts import ModelCounts, count
from qwen3_trn.run.fit.device_memory import margin_bytes
from qwen3_trn.run.fit.layers import rank0_stages
from qwen3_trn.run.fit.memory import MemoryEstimate
from qwen3_trn.run.fit.probe import ActivationProfile, activation_profile
from qwen3_trn.run.layout import Layout
from qwen3_trn.titan import ScaledDotProductAttention, Trainer, grads_set_to_none

# Below this share of the budget, or above it with no activations at all, the closed form
# cannot change the answer and the probe is skipped (train mode: the default run stays fast).
CLEARLY_FITS = 0.5


@dataclass(frozen=True)
class StepModel:
    """What a config's step memory depends on, except the layout."""

    cfg: RunConfig
    device_type: str
    arch: Qwen3Architecture
    counts: ModelCounts
    precision: Precision
    compute_dtype: str
    trainer_config: Trainer.Config

    @classmethod
    def of(
        cls, cfg: RunConfig, device, arch: Qwen3Architecture, trainer_config: Trainer.Config, counts: ModelCounts | None = None
    ) -> StepModel:
        reduce = trainer_config.training.mixed_precision_reduce
        if reduce not in DTYPE_BYTES:  # only reachable through +titan.training.mixed_precision_reduce
            raise ConfigError(
                "titan.training.mixed_precision_reduce",
                f"'{reduce}' is not a dtype torchtitan reduces in; use one of {', '.join(DTYPE_BYTES)}.",
            )
        return cls(
            cfg=cfg,
            device_type=device.type,
            arch=arch,
            counts=counts or count(cfg.model.flavor, arch, cfg.training.seq_len),
            precision=Precision(master=cfg.training.dtype, param=param_dtype(cfg, device), reduce=reduce),
            compute_dtype=compute_dtype(cfg, device),
            trainer_config=trainer_config,
        )

    def shape(self, layout: Layout) -> StepShape:
        training, parallelism = self.cfg.training, self.cfg.parallelism
        return step_shape(
            layout,
            training.local_batch_size,
            training.seq_len,
            parallelism.pp_schedule,
            parallelism.pp_microbatch_size,
            parallelism.fsdp_reshard_after_forward,
            global_batch=training.global_batch_size,
            grads_set_to_none=grads_set_to_none(self.trainer_config.training),
            device_type=self.device_type,
        )

    def probe_model_config(self):
        """The model config the probe cuts: the run's own, or torchtitan's Qwen3 of the same
        architecture where the backend's model is not torchtitan's (hf_v5)."""
        model = self.trainer_config.model_spec.model
        if getattr(model, "layers", None) is not None:
            return model
        return build_model_config(self.cfg.model.flavor, self.arch, ScaledDotProductAttention.Config())

    def analytic(self, shape: StepShape) -> ActivationProfile:
        return analytic_profile(
            self.arch, DTYPE_BYTES[self.compute_dtype], self.cfg.training.activation_checkpoint, shape.micro_batch, shape.seq_len
        )

    def probed(self, shape: StepShape) -> ActivationProfile:
        return activation_profile(
            self.probe_model_config(),
            self.trainer_config.activation_checkpoint,
            getattr(self.trainer_config, "loss", None),  # none before torchtitan 2026-04-27 (qwen3_trn.titan.build_loss)
            self.compute_dtype,
            shape.micro_batch,
            shape.seq_len,
        )

    def estimate(self, layout: Layout, activations: ActivationProfile, source: str) -> MemoryEstimate:
        stages = rank0_stages(self.trainer_config.parallelism, layout.pp, self.arch.n_layers)
        modules = {name for stage in stages for name in stage}
        layers = sum(1 for name in modules if name.startswith("layers."))
        return composed_estimate(
            self.counts,
            layout,
            modules,
            self.precision,
            self.shape(layout),
            activations,
            layers,
            margin=lambda peak: margin_bytes(self.device_type, peak),
            source=source,
        )


def estimate(model: StepModel, layout: Layout, budget: int | None, probe: bool) -> MemoryEstimate:
    """Rank 0's memory. ``probe``: always measure activations; else only where the closed form
    leaves the answer open against ``budget`` (None: measure)."""
    shape = model.shape(layout)
    quick = model.estimate(layout, model.analytic(shape), "analytic")
    persistent = quick.params + quick.grads + quick.optimizer
    clearly_not = persistent + margin_bytes(model.device_type, persistent) > budget if budget is not None else False
    if not probe and budget is not None and (quick.total <= CLEARLY_FITS * budget or clearly_not):
        return quick
    try:
        return model.estimate(layout, model.probed(shape), "composed")
    except Exception as exc:  # noqa: BLE001 - the closed form still answers; the reason is recorded
        return dataclasses.replace(quick, detail={**quick.detail, "probe_failed": f"{type(exc).__name__}: {exc}"[:300]})
