"""Bad input answered before the run's modules (torch, torchtitan, transformers) are imported.

Hydra composes the config and creates the run directory; then, in the task function:

- ``answer_early``: the config typed, every number's range and every path the run reads checked
  (``first_checks``, which preflight runs too, so both say the same). A value out of range stops
  the command there, with every missing path beside it: exit 2, the run directory removed again.
  Otherwise the run's modules load and preflight checks the rest, the data's content included.
- ``SweepCallback``: the sweep callback ``conf/config.yaml`` names, whose implementation
  (``qwen3_trn.sweep.SweepCallback``: launchers, reports) is imported when a multirun starts, not
  when Hydra instantiates the callbacks of every command. The sweeper's own counts and sizes
  (``hydra.sweeper.n_trials``, ...) are checked there, before anything is created.
"""

from __future__ import annotations

import importlib
from contextlib import contextmanager
from dataclasses import fields
from pathlib import Path
from typing import Any, Iterator

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from qwen3_trn.config.paths import absolute_paths, path_problems
from qwen3_trn.config.ranges import range_problems
from qwen3_trn.config.schema import RunConfig
from qwen3_trn.config.store import SWEEPER_SCHEMAS
from qwen3_trn.config.typed import to_run_config
from qwen3_trn.errors import ConfigError, Problems, grouped
from qwen3_trn.exits import exit_status
from qwen3_trn.records import remove_empty_dirs


def in_multirun() -> bool:
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def run_dir_pattern() -> str:
    """``hydra.run.dir`` as configured (not resolved), "" outside a Hydra run."""
    if not HydraConfig.initialized():
        return ""
    return str(OmegaConf.to_container(HydraConfig.get().run, resolve=False).get("dir", ""))


def timestamp_levels(pattern: str) -> int:
    """How many trailing parts of the run directory a ``${now:...}`` pattern creates."""
    levels = 0
    for part in reversed(Path(pattern).parts):
        if "${" not in part:
            break
        levels += 1
    return levels


@contextmanager
def no_run_dir_left() -> Iterator[None]:
    """Bad input leaves nothing behind: Hydra made the run directory before calling the task
    function, and it is removed again (with the timestamped parents it created, while empty)."""
    try:
        yield
    except ConfigError:
        if HydraConfig.initialized():
            remove_empty_dirs(Path(HydraConfig.get().runtime.output_dir), max(1, timestamp_levels(run_dir_pattern())))
        raise


def first_checks(cfg: RunConfig, problems: Problems) -> bool:
    """Every number's range and every path the run reads (made absolute against the working
    directory first), their problems left in ``problems``; whether every number is in range."""
    with problems.check():
        ranges = range_problems(cfg)
        if ranges:
            raise grouped(ranges)
    absolute_paths(cfg)
    with problems.check():
        missing = path_problems(cfg)
        if missing:
            raise grouped(missing)
    return not ranges


def answer_early(cfg_node: DictConfig) -> RunConfig | None:
    """A single run's config typed and its ranges and paths checked (module docstring): exit 2
    when it cannot be typed or a value is out of range. Returns the typed config, which the run
    goes on with (None in a multirun, whose jobs were checked by its sweeper)."""
    if in_multirun():
        return None
    with exit_status(), no_run_dir_left():
        problems = Problems()
        cfg = to_run_config(cfg_node, check_ranges=False)
        if not first_checks(cfg, problems):
            problems.stop_if_any()
    return cfg


def sweeper_problems(sweeper: DictConfig) -> list[ConfigError]:
    """The ranges of the sweeper's own keys (its schema: ``config.store.SWEEPER_SCHEMAS``)."""
    schema = SWEEPER_SCHEMAS.get(str(sweeper.get("_target_")))
    if schema is None:
        return []
    plain = OmegaConf.to_container(sweeper, resolve=True)
    values = schema(**{f.name: plain[f.name] for f in fields(schema) if f.name in plain})
    return range_problems(values, prefix="hydra.sweeper.")


class SweepCallback(Callback):
    """``hydra.callbacks.sweep``: the sweeper's keys checked, then every hook of a multirun handed
    to ``qwen3_trn.sweep.SweepCallback``, imported at the multirun's start."""

    implementation = "qwen3_trn.sweep:SweepCallback"

    def __init__(self, **settings: Any) -> None:
        self.settings = settings
        self.sweep: Callback | None = None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        problems = sweeper_problems(config.hydra.sweeper)
        if problems:  # Hydra turns a callback's exception into a warning: exit here
            with exit_status():
                raise grouped(problems)
        module, _, name = self.implementation.partition(":")
        with exit_status():  # a ConfigError on import (qwen3_trn.titan) is bad input, as above
            self.sweep = getattr(importlib.import_module(module), name)(**self.settings)
        self.sweep.on_multirun_start(config, **kwargs)

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        if self.sweep is not None:
            self.sweep.on_job_start(config, **kwargs)

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        if self.sweep is not None:
            self.sweep.on_job_end(config, job_return, **kwargs)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if self.sweep is not None:
            self.sweep.on_multirun_end(config, **kwargs)
