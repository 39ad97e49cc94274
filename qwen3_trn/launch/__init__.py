"""How ranks are started: ``launcher.name`` picks one of ``LAUNCHERS``."""

from qwen3_trn.launch.local import launch_local

LAUNCHERS = {"local": launch_local}

__all__ = ["LAUNCHERS"]
