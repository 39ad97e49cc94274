"""Hydra instantiates sweepers only from classes defined in the ``hydra_plugins`` namespace:
this one is the project's sweeper (``qwen3_trn.sweeper.CheckedSweeper``) under that name."""

from qwen3_trn import sweeper


class Qwen3TrnSweeper(sweeper.CheckedSweeper):
    """``hydra/sweeper=qwen3_trn``: grid sweeps with preflight and resume (``qwen3_trn.sweeper``)."""


__all__ = ["Qwen3TrnSweeper"]
