"""The typed configuration: the schema of every config group (the bases of the groups whose
options are classes of higher layers: ``options``), its registration with Hydra, overrides, and
the escape hatch into torchtitan's ``Trainer.Config``. The bottom layer: it imports nothing else
of the project but ``errors``."""

from qwen3_trn.config.schema import RunConfig
from qwen3_trn.config.typed import run_config_from_container, to_run_config

__all__ = ["RunConfig", "run_config_from_container", "to_run_config"]
