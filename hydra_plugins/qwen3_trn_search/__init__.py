"""Hydra instantiates sweepers only from classes defined in the ``hydra_plugins`` namespace:
this one is the project's Optuna search (``qwen3_trn.sweeps.search.SearchSweeper``) under that name,
imported only when Hydra sets it up (``hydra_plugins.qwen3_trn_sweeper``)."""

from hydra_plugins.qwen3_trn_sweeper import Qwen3TrnSweeper


class Qwen3TrnSearchSweeper(Qwen3TrnSweeper):
    """``hydra/sweeper=qwen3_trn_search`` (``hparams_search=...``): Optuna trials with pruning,
    preflight and a resumable SQLite study (``qwen3_trn.sweeps.search``)."""

    implementation = "qwen3_trn.sweeps.search:SearchSweeper"


__all__ = ["Qwen3TrnSearchSweeper"]
