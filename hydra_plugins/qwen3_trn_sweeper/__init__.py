"""Hydra instantiates sweepers only from classes defined in the ``hydra_plugins`` namespace:
this one is the project's sweeper (``qwen3_trn.sweeps.sweeper.CheckedSweeper``) under that name.

Hydra imports every module of that namespace on every command, ``--help`` and a mistyped key
included, so the sweeper's implementation (which imports torch and torchtitan through the
launchers and preflight) is imported only when Hydra sets a sweeper up for a multirun.
"""

from __future__ import annotations

import importlib
from typing import Any

from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig


class Qwen3TrnSweeper(Sweeper):
    """``hydra/sweeper=qwen3_trn``: grid sweeps with preflight and resume (``qwen3_trn.sweeps.sweeper``)."""

    # "<module>:<class>" of the sweeper this one sets up and hands every call to.
    implementation = "qwen3_trn.sweeps.sweeper:CheckedSweeper"

    def __init__(self, **settings: Any) -> None:
        self.settings = settings
        self.sweeper: Sweeper | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        module, _, name = self.implementation.partition(":")
        self.sweeper = getattr(importlib.import_module(module), name)(**self.settings)
        self.sweeper.setup(hydra_context=hydra_context, task_function=task_function, config=config)

    def sweep(self, arguments: list[str]) -> Any:
        return self.sweeper.sweep(arguments)


__all__ = ["Qwen3TrnSweeper"]
