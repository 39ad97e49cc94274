"""A training mode: how a composed config becomes the model torchtitan trains.

A ``Backend`` subclass overrides only the hooks its mode needs; its Config lives in
``config.option_schemas``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Protocol

from qwen3_trn.config.options import Configurable
from qwen3_trn.config.schema import BackendConfig, RunConfig
from qwen3_trn.devices import DeviceSpec
from qwen3_trn.models.architecture import Qwen3Architecture
from qwen3_trn.models.hf_config import hf_config_dict
from qwen3_trn.titan import ModelSpec, Trainer


def flavor_architecture(cfg: RunConfig) -> Qwen3Architecture:
    """The model group's torchtitan flavor with its overrides applied."""
    return Qwen3Architecture.of_flavor(cfg.model.flavor).with_overrides(cfg.model)


class ShardingDegrees(Protocol):
    """The parallel degrees that decide what one rank holds."""

    tp: int
    cp: int
    ep: int


# The run_info / what_ran key of the kernel implementation a run's experts use.
KERNEL_KEY = "kernel"


class Backend(Configurable):
    Config: ClassVar[type[BackendConfig]] = BackendConfig
    description: ClassVar[str] = ""
    config: BackendConfig

    def to_dict(self) -> dict[str, Any]:
        """The backend's config, as torchtitan's ``to_dict`` records it in a ``Trainer.Config``."""
        return dataclasses.asdict(self.config)

    def architecture(self, cfg: RunConfig) -> Qwen3Architecture:
        return flavor_architecture(cfg)

    def model_spec(self, cfg: RunConfig, arch: Qwen3Architecture, device: DeviceSpec) -> ModelSpec:
        """The ModelSpec torchtitan builds and parallelizes."""
        raise NotImplementedError

    def trainer_config_class(self) -> type[Trainer.Config]:
        """The Trainer.Config class (a mode may need a subclass with extra fields)."""
        return Trainer.Config

    def trainer_fields(self, cfg: RunConfig) -> dict[str, Any]:
        """Extra Trainer.Config fields this mode sets."""
        return {}

    def validate(self, cfg: RunConfig, arch: Qwen3Architecture, device: DeviceSpec) -> None:
        """Mode-specific checks before any worker starts; raise ConfigError."""

    def settle(self, device: DeviceSpec) -> None:
        """Write the choices made for ``device`` into ``self.config``, which every rank starts from,
        once ``validate`` passed."""

    def validate_sharded(self, cfg: RunConfig, arch: Qwen3Architecture, device: DeviceSpec, degrees: ShardingDegrees) -> None:
        """Checks of the shapes one rank holds, once the parallel layout is final; raise ConfigError."""

    def run_info(self, cfg: RunConfig, arch: Qwen3Architecture, device: DeviceSpec) -> dict[str, Any]:
        """Facts for the run's summary and logged config, predicted in the parent (the experts' kernel
        under ``KERNEL_KEY``)."""
        return {}

    def prepare_process(self, cfg: RunConfig, device: DeviceSpec) -> None:
        """Per-process setup before the Trainer is built (registrations that do not pickle)."""

    def what_ran(self, parts: list[Any], device_type: str) -> dict[str, Any]:
        """Facts of the built model on the metrics rank (the kernel its shards run), recorded over the
        parent's predictions."""
        return {}

    def hf_config(self, cfg: RunConfig, arch: Qwen3Architecture) -> dict[str, Any]:
        """The Hugging Face config.json of an export."""
        return hf_config_dict(arch)
