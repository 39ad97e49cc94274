"""Every check that can fail before a worker starts, and the objects a run needs.

``prepare`` resolves the device and the parallel layout, validates the config against them
and builds the torchtitan ``Trainer.Config``. Any problem is a ``ConfigError`` naming the key
at fault and the fix; nothing has been written or started when it is raised.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from torchtitan.trainer import Trainer

from qwen3_trn.backends import get_backend
from qwen3_trn.config.schema import RunConfig
from qwen3_trn.convert import architecture, to_trainer_config, tokenizer_path
from qwen3_trn.devices import DEVICES, DeviceSpec, planned_device, probe_device, resolve_device
from qwen3_trn.errors import ConfigError
from qwen3_trn.hf.export import check_hf_export
from qwen3_trn.layout import Layout, resolve_layout
from qwen3_trn.models.architecture import Qwen3Architecture
from qwen3_trn.validation import check_validation

MODES = ("train", "plan", "check")
COMPILE_BACKENDS = ("off", "inductor", "aot_eager", "neuron")
COMPILE_COMPONENTS = ("model", "loss", "grad_clip")
LOGGER_BACKENDS = ("wandb", "tensorboard")
WANDB_MODES = ("offline", "online", "disabled")
ACTIVATION_CHECKPOINTING = ("none", "selective", "full")


@dataclass
class Prepared:
    cfg: RunConfig
    device: DeviceSpec
    layout: Layout
    arch: Qwen3Architecture
    trainer_config: Trainer.Config


def _choose(key: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(key, f"'{value}' is not one of {', '.join(allowed)}.")


def _submitting(cfg: RunConfig) -> bool:
    """A run that this machine submits to a Slurm cluster (its ranks run on the cluster's nodes)."""
    from qwen3_trn.launch.slurm import ON_NODE_ENV

    return cfg.launcher.name == "slurm" and not os.environ.get(ON_NODE_ENV)


def _device(cfg: RunConfig) -> DeviceSpec:
    requested = cfg.device.type
    if (cfg.mode != "train" or _submitting(cfg)) and requested in DEVICES and isinstance(probe_device(requested), str):
        return planned_device(requested)  # planning for a machine that is not this one
    return resolve_device(requested)


def _nproc_per_node(cfg: RunConfig, device: DeviceSpec) -> int:
    nproc = cfg.launcher.nproc_per_node
    packed = cfg.launcher.devices_per_job
    if packed < 0 or (cfg.mode == "train" and packed > device.count):
        raise ConfigError(
            "launcher.devices_per_job",
            f"{packed} device(s) per job cannot be packed onto this machine's {device.count} {device.type} device(s); "
            f"use 1..{device.count}, or 0 to turn packing off.",
        )
    if nproc == -1 and packed:
        return packed
    if nproc == -1:
        if device.count == 0:
            raise ConfigError(
                "launcher.nproc_per_node",
                f"-1 means one rank per {device.type} device, but none is present to count; give the number explicitly.",
            )
        return device.count
    if cfg.mode == "train" and not _submitting(cfg) and nproc > device.count:
        raise ConfigError(
            "launcher.nproc_per_node",
            f"{nproc} ranks were asked for, but this machine has {device.count} {device.type} "
            f"device(s); use launcher.nproc_per_node<={device.count} (or -1 for one per device).",
        )
    return nproc


def _check_tokenizer(cfg: RunConfig, arch: Qwen3Architecture) -> None:
    path = Path(tokenizer_path(cfg))
    key = "model.hf_assets_path"
    if not path.is_dir():
        raise ConfigError(key, f"'{path}' is not a directory; point it at a folder holding tokenizer.json (HF assets).")
    tokenizer_json = path / "tokenizer.json"
    if not tokenizer_json.is_file() and not (path / "vocab.json").is_file():
        raise ConfigError(
            key,
            f"'{path}' holds no tokenizer (no tokenizer.json or vocab.json); download the model's HF assets "
            "there, or leave model.hf_assets_path unset to use the tokenizer the project ships.",
        )
    if tokenizer_json.is_file():
        tokenizer = json.loads(tokenizer_json.read_text())
        vocab = tokenizer.get("model", {}).get("vocab", {})
        added = tokenizer.get("added_tokens", [])
        size = max([len(vocab)] + [t["id"] + 1 for t in added])
        if size > arch.vocab_size:
            raise ConfigError(
                "model.vocab_size",
                f"the tokenizer in '{path}' has {size} tokens but the model's vocab_size is {arch.vocab_size}; "
                f"set model.vocab_size>={size} or use a matching tokenizer.",
            )


def _check_training(cfg: RunConfig, arch: Qwen3Architecture, layout: Layout) -> None:
    training = cfg.training
    if training.seq_len > arch.max_seq_len:
        raise ConfigError(
            "training.seq_len",
            f"{training.seq_len} is above the model's max_seq_len {arch.max_seq_len}; "
            f"lower training.seq_len or raise model.max_seq_len.",
        )
    for key in ("steps", "local_batch_size", "seq_len"):
        if getattr(training, key) < 1:
            raise ConfigError(f"training.{key}", f"must be >= 1, got {getattr(training, key)}.")
    per_step = training.local_batch_size * layout.data_parallel
    if training.global_batch_size > 0 and training.global_batch_size % per_step:
        raise ConfigError(
            "training.global_batch_size",
            f"{training.global_batch_size} is not a multiple of local_batch_size x data-parallel degree = {per_step}.",
        )
    _choose("training.dtype", training.dtype, ("float32", "bfloat16"))
    _choose("training.mixed_precision_param", training.mixed_precision_param, ("auto", "float32", "bfloat16"))
    _choose("training.activation_checkpoint", training.activation_checkpoint, ACTIVATION_CHECKPOINTING)


def _check_choices(cfg: RunConfig, device: DeviceSpec) -> None:
    from qwen3_trn.launch import LAUNCHERS

    _choose("mode", cfg.mode, MODES)
    _choose("compile.backend", cfg.compile.backend, COMPILE_BACKENDS)
    for component in cfg.compile.components:
        _choose("compile.components", component, COMPILE_COMPONENTS)
    if cfg.compile.backend == "neuron" and device.type != "neuron":
        raise ConfigError(
            "compile.backend",
            f"compile=neuron needs torch-neuronx's 'neuron' compiler backend, but the device is {device.type}; "
            "use compile=inductor or compile=off here, or plan a Trainium run with device=neuron mode=plan.",
        )
    for name in cfg.logger.backends:
        _choose("logger.backends", name, LOGGER_BACKENDS)
    _choose("logger.wandb.mode", cfg.logger.wandb.mode, WANDB_MODES)
    _choose("launcher.name", cfg.launcher.name, tuple(LAUNCHERS))
    if cfg.launcher.name == "slurm":
        from qwen3_trn.launch import slurm

        slurm.check_config(cfg)


def _layout(cfg: RunConfig, device: DeviceSpec) -> Layout:
    """The parallel layout; ``launcher.nodes`` (the node count's user-facing name) sets nnodes."""
    nodes = cfg.launcher.nodes
    if nodes is None:
        return resolve_layout(cfg.parallelism, cfg.launcher.nnodes, _nproc_per_node(cfg, device))
    cfg.launcher.nnodes = nodes
    try:
        return resolve_layout(cfg.parallelism, nodes, _nproc_per_node(cfg, device))
    except ConfigError as exc:
        message = str(exc)[len(exc.key) + 2:].replace("launcher.nnodes", "launcher.nodes")
        raise ConfigError(exc.key.replace("launcher.nnodes", "launcher.nodes"), message) from None


def prepare(cfg: RunConfig) -> Prepared:
    _choose("mode", cfg.mode, MODES)
    backend = get_backend(cfg.backend.name)
    device = _device(cfg)
    _check_choices(cfg, device)
    layout = _layout(cfg, device)
    arch = architecture(cfg)
    _check_training(cfg, arch, layout)
    check_validation(cfg.validation, cfg.training.seq_len, arch.max_seq_len, pipeline_parallel=layout.pp > 1)
    check_hf_export(cfg.checkpoint)
    _check_tokenizer(cfg, arch)
    backend.validate(cfg, arch, device)
    try:
        trainer_config = to_trainer_config(cfg, device, layout)
    except (ValueError, AssertionError) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError("titan", f"torchtitan refused the resulting Trainer.Config: {exc}") from exc
    if cfg.mode == "train" and _submitting(cfg):
        from qwen3_trn.launch.slurm import check_cluster

        check_cluster(cfg, layout.nnodes)  # Slurm reachable, the partition known, before anything is written
    return Prepared(cfg=cfg, device=device, layout=layout, arch=arch, trainer_config=trainer_config)
