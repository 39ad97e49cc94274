"""Every option of the config groups whose options are classes: the backends, launchers and data
sources, each defined in its own module of ``qwen3_trn.backends``, ``qwen3_trn.launch`` and
``qwen3_trn.data.sources`` (importing a package imports all its modules, and each option registers
itself in its group's ``options``: ``qwen3_trn.config.options``).

``register_schema`` stores the typed schema in Hydra's ConfigStore: ``RunConfig`` and the
sweepers (``config.store``), and each option's Config as ``schema/<group>/<option>``, which the
option's YAML names in its defaults (``/schema/backend@_here_: native``), so a key that does not
belong to the chosen option is refused at composition. ``load_run_config`` types a saved config
in a process that may not have imported every option otherwise (``qwen3_trn.rank``).
"""

from pathlib import Path

from hydra.core.config_store import ConfigStore

from qwen3_trn import backends, launch, records
from qwen3_trn.config import store
from qwen3_trn.config.schema import RunConfig, option_groups
from qwen3_trn.data import sources

# The packages whose modules define the options (imported above, which registers them).
OPTION_PACKAGES = (backends, launch, sources)


def register_schema() -> None:
    store.register_schema()
    config_store = ConfigStore.instance()
    for group, base in option_groups().items():
        for option, schema in base.registered().items():
            config_store.store(group=f"schema/{group}", name=option, node=schema)


def load_run_config(path: str | Path) -> RunConfig:
    """A run's saved config (``records.load_run_config``), typed by any option of its groups."""
    return records.load_run_config(path)


__all__ = ["OPTION_PACKAGES", "load_run_config", "register_schema"]
