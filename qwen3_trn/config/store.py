"""Registers the typed schema in Hydra's ConfigStore.

``conf/config.yaml`` lists ``run_schema`` first in its defaults, so every group's YAML is
merged onto the typed ``RunConfig``. A group with a schema per option (``OPTION_SCHEMAS``)
stores each under ``schema/<group>/<option>``; the option's YAML names it in its defaults
(``/schema/backend@_here_: native``), so its keys are checked against that option's dataclass.
"""

import typing
from dataclasses import dataclass, field
from typing import Optional

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from qwen3_trn.config.schema import OPTION_SCHEMAS, RunConfig

SCHEMA_NAME = "run_schema"
SWEEPER_NAME = "qwen3_trn"


@dataclass
class CheckedSweeperConf:
    """``hydra/sweeper=qwen3_trn`` (the default): Hydra's basic sweeper's settings, with
    preflight and resume (``qwen3_trn.sweeper``)."""

    _target_: str = "hydra_plugins.qwen3_trn_sweeper.Qwen3TrnSweeper"
    max_batch_size: Optional[int] = None
    params: Optional[dict[str, str]] = field(default_factory=dict)


def run_schema() -> DictConfig:
    """``RunConfig`` with each per-option group typed by its base class, so that composing any
    option's schema (a subclass) onto it is allowed."""
    node = OmegaConf.structured(RunConfig)
    hints = typing.get_type_hints(RunConfig)
    for group in OPTION_SCHEMAS:
        node[group] = OmegaConf.structured(hints[group])
    return node


def register_schema() -> None:
    store = ConfigStore.instance()
    store.store(name=SCHEMA_NAME, node=run_schema())
    store.store(group="hydra/sweeper", name=SWEEPER_NAME, node=CheckedSweeperConf, provider="qwen3_trn")
    for group, (_, options) in OPTION_SCHEMAS.items():
        for option, schema in options.items():
            store.store(group=f"schema/{group}", name=option, node=schema)
