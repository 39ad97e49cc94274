"""Bad input answered before torch, torchtitan and transformers are imported.

``answer_early`` types a single run's config and checks its ranges and paths (the same
``first_checks`` preflight runs). ``every_problem`` composes a command line that did not
compose again without the override at fault, to report its other problems too. ``SweepCallback`` checks the sweeper's keys and defers the
rest of a multirun to ``qwen3_trn.sweeps.sweep``, imported only when a multirun starts.
"""

from __future__ import annotations

import importlib
from contextlib import contextmanager
from dataclasses import fields
from pathlib import Path
from typing import Any, Iterator

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from qwen3_trn.cli.exits import exit_status
from qwen3_trn.common.errors import ConfigError, Problems, grouped
from qwen3_trn.config.composition import composition_error, failing_override
from qwen3_trn.config.paths import absolute_paths, path_problems
from qwen3_trn.config.ranges import range_problems
from qwen3_trn.config.schema import RunConfig
from qwen3_trn.config.store import SWEEPER_SCHEMAS, register_schema
from qwen3_trn.config.typed import to_run_config
from qwen3_trn.results.records import remove_empty_dirs

# The packaged config groups, as an absolute path: Hydra then searches the directory itself. A
# relative one is looked up as the package ``qwen3_trn.conf`` when the entry point is the
# installed ``qwen3-trn`` script, which Hydra refuses without an __init__.py in conf/.
CONF_DIR = Path(__file__).resolve().parents[1] / "conf"


def in_multirun() -> bool:
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def run_dir_pattern() -> str:
    """Unresolved ``hydra.run.dir``; "" outside a Hydra run."""
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
    """Remove the run directory Hydra made before the task function (and its empty timestamped
    parents) when the input is bad."""
    try:
        yield
    except ConfigError:
        if HydraConfig.initialized():
            remove_empty_dirs(Path(HydraConfig.get().runtime.output_dir), max(1, timestamp_levels(run_dir_pattern())))
        raise


def first_checks(cfg: RunConfig, problems: Problems) -> bool:
    """Check every number's range and every path the run reads (made absolute first), leaving the
    problems in ``problems``. Returns whether every number is in range."""
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
    """Exit 2 when a single run's config cannot be typed or a value is out of range; else the
    typed config, which the run goes on with (None in a multirun: its sweeper checked its jobs)."""
    if in_multirun():
        return None
    with exit_status(), no_run_dir_left():
        problems = Problems()
        cfg = to_run_config(cfg_node, check_ranges=False)
        if not first_checks(cfg, problems):
            problems.stop_if_any()
    return cfg


def _gives(key: str, overrides: list[str]) -> bool:
    return any(o.lstrip("+~").partition("=")[0] == key for o in overrides)


def _composed(overrides: list[str], conf_dir: Path) -> DictConfig:
    GlobalHydra.instance().clear()
    with initialize_config_dir(version_base="1.3", config_dir=str(conf_dir)):
        # output_dir is Hydra's run directory, which only a run has; the checks do not read it
        return compose("config", overrides=[*overrides, *(() if _gives("output_dir", overrides) else ("output_dir=.",))])


def every_problem(exc: BaseException, overrides: list[str], conf_dir: Path) -> ConfigError:
    """A command line that did not compose: its first problem, then the rest of it composed
    again without the override at fault, until it composes and is typed and checked, so that
    every problem of the command is reported at once. ``overrides``: the command line's
    overrides (not its flags) against the packaged ``conf_dir``."""
    problems = Problems()
    problems.found.append(composition_error(exc))
    rest, bad = list(overrides), failing_override(exc)
    while bad in rest:
        rest.remove(bad)
        try:
            cfg = _composed(rest, conf_dir)
        except Exception as again:  # noqa: BLE001 - the next composition problem, reported with the first
            problems.found.append(composition_error(again))
            bad = failing_override(again)
            continue
        with problems.check():
            first_checks(to_run_config(cfg, check_ranges=False), problems)
        break
    return grouped(problems.found)


def command_problems(overrides: list[str], conf_dir: Path) -> ConfigError | None:
    """Every problem ``python -m qwen3_trn <overrides>`` would answer with exit 2 before it
    trains (composition, types, ranges, paths), as one error; None for a command that passes.
    For commands that start runs of their own (``qwen3_trn.compare``), before the first starts."""
    register_schema()
    try:
        cfg = _composed(overrides, conf_dir)
    except Exception as exc:  # noqa: BLE001 - a composition problem, with the command's others
        return every_problem(exc, overrides, conf_dir)
    problems = Problems()
    with problems.check():
        first_checks(to_run_config(cfg, check_ranges=False), problems)
    return grouped(problems.found) if problems.found else None


def sweeper_problems(sweeper: DictConfig) -> list[ConfigError]:
    """The ranges of the sweeper's own keys (``config.store.SWEEPER_SCHEMAS``)."""
    schema = SWEEPER_SCHEMAS.get(str(sweeper.get("_target_")))
    if schema is None:
        return []
    plain = OmegaConf.to_container(sweeper, resolve=True)
    values = schema(**{f.name: plain[f.name] for f in fields(schema) if f.name in plain})
    return range_problems(values, prefix="hydra.sweeper.")


class SweepCallback(Callback):
    """``hydra.callbacks.sweep``: checks the sweeper's keys, then hands every hook to
    ``qwen3_trn.sweeps.sweep.SweepCallback``."""

    implementation = "qwen3_trn.sweeps.sweep:SweepCallback"

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
