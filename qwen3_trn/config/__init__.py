"""The typed configuration: the schema of every config group, its registration with Hydra,
overrides, and the escape hatch into torchtitan's ``Trainer.Config``. The bottom layer: it
imports nothing else of the project but ``errors``."""

from qwen3_trn.config.schema import RunConfig
from qwen3_trn.config.store import register_schema
from qwen3_trn.config.typed import run_config_from_container, to_run_config

__all__ = ["RunConfig", "register_schema", "run_config_from_container", "to_run_config"]
