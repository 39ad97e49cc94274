"""How ranks are started: ``launcher.name`` picks one of ``LAUNCHERS`` (``base.Launcher``).

The launcher layer sits above preflight and the worker: a launcher starts the worker's
ranks of a prepared run, on this machine (``local``) or on a cluster (``slurm``)."""

from qwen3_trn.config.schema import LauncherConfig
from qwen3_trn.launch.base import LaunchDescription, Launcher
from qwen3_trn.launch.local import LocalLauncher
from qwen3_trn.launch.slurm import SlurmLauncher

LAUNCHERS: dict[str, type[Launcher]] = {launcher.name: launcher for launcher in (LocalLauncher, SlurmLauncher)}


def build_launcher(config: LauncherConfig) -> Launcher:
    return LAUNCHERS[config.name](config)


__all__ = ["LAUNCHERS", "LaunchDescription", "Launcher", "build_launcher"]
