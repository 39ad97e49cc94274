"""Composed config -> torchtitan ``Trainer.Config``.

``to_trainer_config`` is pure (it starts nothing): call it to get the exact config a run trains with.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from qwen3_trn.backends import Backend
from qwen3_trn.checkpointing import ResumePoint, find_resume_point
from qwen3_trn.config.schema import CheckpointConfig, LoggerBackend, RunConfig, warmup_steps
from qwen3_trn.config.titan_overrides import apply_titan_overrides
from qwen3_trn.data.embedded import ensure_assets, tokenizer_dir
from qwen3_trn.data.sources import resolve_dataset
from qwen3_trn.devices import DeviceSpec
from qwen3_trn.hf.export import HFExportCheckpointManager
from qwen3_trn.models.architecture import Qwen3Architecture
from qwen3_trn.run.layout import Layout
from qwen3_trn.run.metrics import RunMetricsProcessor
from qwen3_trn.run.validation import validator_config
from qwen3_trn.titan import CompileConfig as TitanCompileConfig
from qwen3_trn.titan import (
    DebugConfig,
    HuggingFaceTextDataLoader,
    LRSchedulersContainer,
    OptimizersContainer,
    Trainer,
    activation_checkpoint_config,
    compiled_components,
    loss_config,
    optimizer_config,
    torchtitan_version,
    training_config,
)
from qwen3_trn.titan import ParallelismConfig as TitanParallelismConfig


def compile_warning(cfg: RunConfig) -> str | None:
    """The ``compile.components`` this torchtitan accepts but ignores, in one line, or None."""
    compiled = compiled_components()
    ignored = [str(c) for c in cfg.compile.components if str(c) not in compiled]
    if cfg.compile.backend == "off" or not ignored:
        return None
    return (
        f"warning: compile.components: {', '.join(ignored)} will not be compiled: torchtitan {torchtitan_version()} "
        f"compiles only {' and '.join(compiled)} and ignores the rest, so it runs eagerly; "
        f"drop {', '.join(ignored)} from compile.components to silence this."
    )


def tokenizer_path(cfg: RunConfig) -> str:
    if cfg.model.hf_assets_path:
        return cfg.model.hf_assets_path
    return str(tokenizer_dir(ensure_assets()))


def param_dtype(cfg: RunConfig, device: DeviceSpec) -> str:
    """FSDP's mixed-precision param dtype; ``auto`` is bf16 where the device runs it natively."""
    if cfg.training.mixed_precision_param != "auto":
        return str(cfg.training.mixed_precision_param)
    return "bfloat16" if device.fast_bf16 else "float32"


def compute_dtype(cfg: RunConfig, device: DeviceSpec) -> str:
    """The dtype matmuls run in. torchtitan applies FSDP's mixed precision even at degree 1, so
    training in fp32 computes in the param dtype."""
    return param_dtype(cfg, device) if cfg.training.dtype == "float32" else str(cfg.training.dtype)


def resume_checkpoint(checkpoint: CheckpointConfig) -> ResumePoint | None:
    """The given step-N folder, or the newest complete one of a run directory."""
    if not checkpoint.resume_from:
        return None
    return find_resume_point(Path(checkpoint.resume_from).expanduser(), checkpoint.folder)


def _checkpoint(cfg: RunConfig, arch: Qwen3Architecture, backend: Backend) -> HFExportCheckpointManager.Config:
    ckpt = cfg.checkpoint
    resume_point = resume_checkpoint(ckpt)
    resume = str(resume_point.path) if resume_point else None
    initial_load_path = resume or ckpt.initial_load_path
    return HFExportCheckpointManager.Config(
        # torchtitan's manager saves nothing unless enabled, so the HF export alone enables it too.
        enable=ckpt.enable or initial_load_path is not None or ckpt.hf_export,
        dcp=ckpt.enable or initial_load_path is not None,
        folder=ckpt.folder,
        interval=ckpt.interval,
        keep_latest_k=ckpt.keep_latest_k,
        load_step=ckpt.load_step,
        initial_load_path=initial_load_path,
        # torchtitan warns about this flag whenever no initial_load_path is set.
        initial_load_model_only=initial_load_path is not None and resume is None,
        initial_load_in_hf=ckpt.initial_load_in_hf and resume is None,
        last_save_model_only=False,
        export_dtype=str(ckpt.export_dtype),
        hf_export=ckpt.hf_export,
        hf_interval=ckpt.hf_interval,
        hf_folder=ckpt.hf_folder,
        hf_config=backend.hf_config(cfg, arch) if ckpt.hf_export else {},
        tokenizer_dir=tokenizer_path(cfg),
    )


def _optimizer(cfg: RunConfig) -> OptimizersContainer.Config:
    opt = cfg.optimizer
    return optimizer_config(str(opt.name), lr=opt.lr, betas=(opt.beta1, opt.beta2), eps=opt.eps, weight_decay=opt.weight_decay)


def _loss(arch: Qwen3Architecture) -> dict[str, Any]:
    """``loss=`` where this torchtitan's Trainer.Config takes one."""
    loss = loss_config(arch.vocab_size)
    return {} if loss is None else {"loss": loss}


def run_info(cfg: RunConfig, device: DeviceSpec, layout: Layout, arch: Qwen3Architecture, backend: Backend) -> dict[str, Any]:
    return {
        "backend": cfg.backend.name,
        "launcher": cfg.launcher.name,
        "device": device.type,
        "flavor": cfg.model.flavor,
        "architecture": arch.summary(),
        "world_size": layout.world_size,
        "layout": layout.describe(),
        "seed": cfg.training.seed,
        "run_dir": cfg.output_dir,
        **backend.run_info(cfg, arch, device),
    }


def to_trainer_config(cfg: RunConfig, device: DeviceSpec, layout: Layout, backend: Backend) -> Trainer.Config:
    arch = backend.architecture(cfg)
    model_spec = device.adapt_model_spec(backend.model_spec(cfg, arch, device))
    dataset = resolve_dataset(cfg.data, cfg.training.seed)
    training = cfg.training
    compile_enabled = cfg.compile.backend != "off"

    trainer_config = backend.trainer_config_class()(
        model_spec=model_spec,
        hf_assets_path=tokenizer_path(cfg),
        dump_folder=cfg.output_dir,
        metrics=RunMetricsProcessor.Config(
            log_freq=cfg.logger.log_freq,
            enable_wandb=LoggerBackend.wandb in cfg.logger.backends,
            enable_tensorboard=LoggerBackend.tensorboard in cfg.logger.backends,
            disable_color_printing=True,
            run_dir=cfg.output_dir,
            total_steps=training.steps,
            run_info=run_info(cfg, device, layout, arch, backend),
            backend=backend,
            validation_interval=cfg.validation.interval if cfg.validation.enable else 0,
            hf_export_dir=str(Path(cfg.output_dir) / cfg.checkpoint.hf_folder) if cfg.checkpoint.hf_export else "",
            trial=cfg.sweep.trial,
        ),
        dataloader=HuggingFaceTextDataLoader.Config(dataset=dataset.name, dataset_path=dataset.path, num_workers=cfg.data.num_workers),
        optimizer=_optimizer(cfg),
        lr_scheduler=LRSchedulersContainer.Config(
            warmup_steps=warmup_steps(cfg.optimizer, training.steps),
            decay_ratio=cfg.optimizer.decay_ratio,
            decay_type=str(cfg.optimizer.decay_type),
            min_lr_factor=cfg.optimizer.min_lr_factor,
        ),
        training=training_config(
            local_batch_size=training.local_batch_size,
            global_batch_size=training.global_batch_size,
            seq_len=training.seq_len,
            max_norm=training.max_norm,
            steps=training.steps,
            dtype=str(training.dtype),
            mixed_precision_param=param_dtype(cfg, device),
            gc_freq=training.gc_freq,
            # Only CUDA replays CUDA graphs; elsewhere torchtitan's default would still keep every
            # gradient allocated and zero-filled for replay (zero_grad(set_to_none=False)). torchtitan
            # also refuses them (at config time, on every device) with pipeline stages or expert
            # parallel's all-to-all dispatcher.
            disable_cuda_graphs=device.type != "cuda" or layout.pp > 1 or layout.ep > 1,
        ),
        parallelism=TitanParallelismConfig(
            data_parallel_replicate_degree=layout.dp_replicate,
            data_parallel_shard_degree=layout.dp_shard,
            tensor_parallel_degree=layout.tp,
            pipeline_parallel_degree=layout.pp,
            context_parallel_degree=layout.cp,
            expert_parallel_degree=layout.ep,
            pipeline_parallel_schedule=cfg.parallelism.pp_schedule,
            pipeline_parallel_microbatch_size=cfg.parallelism.pp_microbatch_size,
            fsdp_reshard_after_forward=str(cfg.parallelism.fsdp_reshard_after_forward),
        ),
        checkpoint=_checkpoint(cfg, arch, backend),
        validator=validator_config(cfg.validation, cfg.data, last_step=training.steps, num_workers=cfg.data.num_workers),
        activation_checkpoint=activation_checkpoint_config(str(training.activation_checkpoint)),
        compile=TitanCompileConfig(
            enable=compile_enabled,
            backend=str(cfg.compile.backend) if compile_enabled else "inductor",
            components=[str(c) for c in cfg.compile.components],
        ),
        debug=DebugConfig(seed=training.seed, deterministic=training.deterministic),
        **_loss(arch),
        **backend.trainer_fields(cfg),
    )
    apply_titan_overrides(trainer_config, cfg.titan)
    return trainer_config
