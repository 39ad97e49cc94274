"""A training mode: how a composed config becomes the model torchtitan trains."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from torchtitan.protocols.model_spec import ModelSpec
from torchtitan.trainer import Trainer

from qwen3_trn.config.schema import RunConfig
from qwen3_trn.devices import DeviceSpec
from qwen3_trn.models.architecture import Qwen3Architecture
from qwen3_trn.models.hf_config import hf_config_dict


def flavor_architecture(cfg: RunConfig) -> Qwen3Architecture:
    """The model group's torchtitan flavor with its overrides applied."""
    return Qwen3Architecture.of_flavor(cfg.model.flavor).with_overrides(cfg.model)


def flavor_hf_config(cfg: RunConfig, arch: Qwen3Architecture) -> dict[str, Any]:
    """The Hugging Face config.json of the architecture (what an HF export carries)."""
    return hf_config_dict(arch)


def _no_checks(cfg: RunConfig, arch: Qwen3Architecture, device: DeviceSpec) -> None:
    return None


def _no_info(cfg: RunConfig, arch: Qwen3Architecture, device: DeviceSpec) -> dict[str, Any]:
    return {}


@dataclass(frozen=True)
class Backend:
    name: str
    description: str
    # The ModelSpec torchtitan builds and parallelizes, for the config's architecture.
    model_spec: Callable[[RunConfig, Qwen3Architecture, DeviceSpec], ModelSpec]
    # The Trainer.Config class (a mode may need a subclass with extra fields).
    trainer_config_class: Callable[[], type[Trainer.Config]] = field(default=lambda: Trainer.Config)
    # Mode-specific checks run before any worker starts; raise ConfigError.
    validate: Callable[[RunConfig, Qwen3Architecture, DeviceSpec], None] = _no_checks
    # Facts recorded in the run's summary and logged config (e.g. which kernel ran).
    run_info: Callable[[RunConfig, Qwen3Architecture, DeviceSpec], dict[str, Any]] = _no_info
    # Per-process setup before the Trainer is built (registrations that do not pickle).
    prepare_process: Callable[[RunConfig, DeviceSpec], None] = field(default=lambda cfg, device: None)
    # Extra Trainer.Config fields this mode sets (e.g. hf_model for the HF backend).
    trainer_fields: Callable[[RunConfig], dict[str, Any]] = field(default=lambda cfg: {})
    # The architecture the config describes (hf_v5 reads it from model.hf_model when given).
    architecture: Callable[[RunConfig], Qwen3Architecture] = flavor_architecture
    # Facts of the built model on the metrics rank (e.g. the kernel its local shards run),
    # recorded in summary.json over the parent's predictions: (model parts, device type).
    what_ran: Callable[[list[Any], str], dict[str, Any]] = field(default=lambda parts, device_type: {})
    # The Hugging Face config.json of an export (hf_v5 keeps model.hf_model's other fields).
    hf_config: Callable[[RunConfig, Qwen3Architecture], dict[str, Any]] = flavor_hf_config
