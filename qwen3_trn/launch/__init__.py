"""How ranks are started: ``launcher.name`` picks one of ``LAUNCHERS``."""

from qwen3_trn.launch.local import launch_local


def launch_slurm(job):
    """``launcher=slurm``: ``qwen3_trn.launch.slurm`` (imported here, so that
    ``python -m qwen3_trn.launch.slurm`` runs it as a fresh module; submitit only when submitting)."""
    from qwen3_trn.launch.slurm import launch_slurm as launch

    return launch(job)


LAUNCHERS = {"local": launch_local, "slurm": launch_slurm}

__all__ = ["LAUNCHERS"]
