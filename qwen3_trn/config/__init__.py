"""The typed configuration: every group's schema, its registration with Hydra, overrides, and
the escape hatch into torchtitan's ``Trainer.Config``. The bottom layer: it imports only
``errors`` of the project, and no torch or torchtitan, so composing a config stays light.
"""

from qwen3_trn.config import option_schemas  # noqa: F401  (each option registers itself in its group)
from qwen3_trn.config.schema import RunConfig
from qwen3_trn.config.typed import run_config_from_container, to_run_config

__all__ = ["RunConfig", "run_config_from_container", "to_run_config"]
