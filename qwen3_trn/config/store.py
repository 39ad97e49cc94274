"""Registers the typed schema in Hydra's ConfigStore.

``conf/config.yaml`` lists ``run_schema`` first in its defaults, so every group's YAML is
merged onto the typed ``RunConfig``. Each option of a group with a schema per option is stored
as ``schema/<group>/<option>`` (its Config, ``option_schemas``), which the option's YAML names in
its defaults (``/schema/backend@_here_: native``), so a key that does not belong to the chosen
option is refused at composition.
"""

from dataclasses import dataclass, field
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from qwen3_trn.config.keys import key
from qwen3_trn.config.schema import RunConfig, option_groups

SCHEMA_NAME = "run_schema"
SWEEPER_NAME = "qwen3_trn"
SEARCH_SWEEPER_NAME = "qwen3_trn_search"


@dataclass
class CheckedSweeperConf:
    """``hydra/sweeper=qwen3_trn`` (the default): Hydra's basic sweeper's settings, with
    preflight and resume (``qwen3_trn.sweeper``)."""

    _target_: str = "hydra_plugins.qwen3_trn_sweeper.Qwen3TrnSweeper"
    max_batch_size: Optional[int] = key(None, ge=1)
    params: Optional[dict[str, str]] = field(default_factory=dict)


@dataclass
class SearchSweeperConf:
    """``hydra/sweeper=qwen3_trn_search`` (chosen by ``hparams_search=<name>``): an Optuna study
    of ``n_trials`` trials over ``params`` (Hydra's sweep grammar), minimising the final
    validation loss, with the sampler and pruner named here (``qwen3_trn.search``)."""

    _target_: str = "hydra_plugins.qwen3_trn_search.Qwen3TrnSearchSweeper"
    n_trials: int = key(10, ge=1)
    # trials in flight at once: the next is asked as soon as one ends
    n_concurrent: int = key(1, ge=1)
    direction: str = "minimize"
    study_name: Optional[str] = None  # null: "search"
    # null: sqlite:///<sweep dir>/optuna.db, or the journal <sweep dir>/optuna.journal where the
    # ranks run elsewhere (launcher=slurm); a URL (mysql+pymysql://user:password@host/db) or a journal path
    storage: Optional[str] = None
    # {name: tpe|random|cmaes|qmc, ...the sampler's arguments}
    sampler: dict[str, Any] = field(default_factory=lambda: {"name": "tpe"})
    # {name: median|percentile|successive_halving|hyperband|threshold|none, ...the pruner's arguments}
    pruner: dict[str, Any] = field(default_factory=lambda: {"name": "none"})
    params: Optional[dict[str, str]] = field(default_factory=dict)
    max_batch_size: Optional[int] = key(None, ge=1)


# The schema of each sweeper, by the ``_target_`` Hydra instantiates (its keys' ranges are
# checked when a multirun starts: ``qwen3_trn.early``).
SWEEPER_SCHEMAS: dict[str, type] = {schema._target_: schema for schema in (CheckedSweeperConf, SearchSweeperConf)}


def run_schema() -> DictConfig:
    """``RunConfig`` with each per-option group typed by its base class, so that composing any
    option's schema (a subclass) onto it is allowed."""
    node = OmegaConf.structured(RunConfig)
    for group, base in option_groups().items():
        node[group] = OmegaConf.structured(base)
    return node


def register_schema() -> None:
    """``RunConfig``, every option's Config and the sweepers."""
    store = ConfigStore.instance()
    store.store(name=SCHEMA_NAME, node=run_schema())
    for group, base in option_groups().items():
        for option, schema in base.registered().items():
            store.store(group=f"schema/{group}", name=option, node=schema)
    store.store(group="hydra/sweeper", name=SWEEPER_NAME, node=CheckedSweeperConf, provider="qwen3_trn")
    store.store(group="hydra/sweeper", name=SEARCH_SWEEPER_NAME, node=SearchSweeperConf, provider="qwen3_trn")
