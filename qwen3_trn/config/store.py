"""Registers the typed schema in Hydra's ConfigStore.

``conf/config.yaml`` lists ``run_schema`` first in its defaults, so every group's YAML is
merged onto the typed ``RunConfig`` and validated as it is composed.
"""

from hydra.core.config_store import ConfigStore

from qwen3_trn.config.schema import RunConfig

SCHEMA_NAME = "run_schema"


def register_schema() -> None:
    ConfigStore.instance().store(name=SCHEMA_NAME, node=RunConfig)
