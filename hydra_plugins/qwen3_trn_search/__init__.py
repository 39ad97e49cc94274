"""Hydra instantiates sweepers only from classes defined in the ``hydra_plugins`` namespace:
this one is the project's Optuna search (``qwen3_trn.search.SearchSweeper``) under that name."""

from qwen3_trn import search


class Qwen3TrnSearchSweeper(search.SearchSweeper):
    """``hydra/sweeper=qwen3_trn_search`` (``hparams_search=...``): Optuna trials with pruning,
    preflight and a resumable SQLite study (``qwen3_trn.search``)."""


__all__ = ["Qwen3TrnSearchSweeper"]
