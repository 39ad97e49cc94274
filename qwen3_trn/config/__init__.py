"""The typed configuration: the schema of every config group and of every option of the groups
whose options are classes of higher layers (``options``, ``option_schemas``), its registration
with Hydra, overrides, and the escape hatch into torchtitan's ``Trainer.Config``. The bottom
layer: it imports nothing else of the project but ``errors``, and neither torch nor torchtitan,
so composing and checking a config needs nothing heavier than Hydra."""

from qwen3_trn.config import option_schemas  # noqa: F401  (each option registers itself in its group)
from qwen3_trn.config.schema import RunConfig
from qwen3_trn.config.typed import run_config_from_container, to_run_config

__all__ = ["RunConfig", "run_config_from_container", "to_run_config"]
