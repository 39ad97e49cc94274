"""How ranks are started: ``launcher.name`` picks a ``base.Launcher`` class, each in a module of
this package (``local``, ``slurm``) with its ``Config`` from ``qwen3_trn.config.option_schemas``
(registered in ``LauncherConfig.options``); importing the package imports every module, so each
class becomes its Config's owner. A new launcher is one module here, its Config there and its
``conf/launcher/<name>.yaml``.

The launcher layer sits above preflight and the worker: a launcher starts the worker's
ranks of a prepared run, on this machine (``local``) or on a cluster (``slurm``); what runs on
a node, whichever launcher started it, is ``node``'s."""

from typing import Any

from omegaconf import DictConfig, OmegaConf

from qwen3_trn.config.options import import_submodules
from qwen3_trn.config.schema import LauncherConfig
from qwen3_trn.launch.base import LaunchDescription, Launcher

import_submodules(__name__, __path__)


def build_launcher(config: LauncherConfig) -> Launcher:
    return config.build()


def launcher_named(name: str) -> type[Launcher]:
    """The Launcher class ``launcher=<name>`` selects."""
    return LauncherConfig.options[name]._owner


def launcher_of(node: DictConfig | dict[str, Any] | None) -> Launcher:
    """The Launcher of a composed ``launcher`` node, as Hydra hands a callback the config (the
    group's default where there is none)."""
    plain = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node or {})
    option = LauncherConfig.options[plain.get("name", LauncherConfig.name)]
    return build_launcher(OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(option), plain)))


__all__ = ["LaunchDescription", "Launcher", "build_launcher", "launcher_named", "launcher_of"]
