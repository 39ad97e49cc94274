"""Registers the typed schema in Hydra's ConfigStore.

``conf/config.yaml`` lists ``run_schema`` first, so every group's YAML merges onto ``RunConfig``.
Each option's Config is stored as ``schema/<group>/<option>``, which its YAML names in its
defaults, so a key the chosen option lacks is refused at composition.
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
    """``hydra/sweeper=qwen3_trn`` (default): Hydra's basic sweeper with preflight and resume."""

    _target_: str = "hydra_plugins.qwen3_trn_sweeper.Qwen3TrnSweeper"
    max_batch_size: Optional[int] = key(None, ge=1)
    params: Optional[dict[str, str]] = field(default_factory=dict)


@dataclass
class SearchSweeperConf:
    """``hydra/sweeper=qwen3_trn_search`` (``hparams_search=<name>``): an Optuna study of
    ``n_trials`` trials over ``params``, minimising the final validation loss."""

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
# checked when a multirun starts: ``qwen3_trn.cli.early``).
SWEEPER_SCHEMAS: dict[str, type] = {schema._target_: schema for schema in (CheckedSweeperConf, SearchSweeperConf)}


def _the_same_store(store: ConfigStore, memo: dict[int, Any]) -> ConfigStore:
    return store


# Hydra 1.3 deep-copies its config repository for every group it lists (CachingConfigRepository,
# against initialize_sources mutating the list of sources), and the structured config source in it
# holds the process-wide ConfigStore: each copy duplicated every stored schema, 10 ms, about 150
# times for --help. The store is a singleton that every source reads (ConfigStore.instance()), so
# a copy of it is the store itself.
ConfigStore.__deepcopy__ = _the_same_store


def run_schema() -> DictConfig:
    """``RunConfig`` with each per-option group typed by its base class, so that any option's
    schema may be composed onto it."""
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
