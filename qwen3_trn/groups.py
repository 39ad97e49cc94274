"""Every implementation of the config groups whose options are classes: the backends, launchers
and data sources, each defined in its own module of ``qwen3_trn.backends``, ``qwen3_trn.launch``
and ``qwen3_trn.data.sources`` (importing a package imports all its modules, and each class
becomes the ``_owner`` of its option's Config, ``qwen3_trn.config.option_schemas``, which
``Config.build()`` makes). Composing and checking a config needs none of them
(``qwen3_trn.config.store``); building a run's parts does.

``load_run_config`` types a saved config in a process that may not have imported every option's
implementation otherwise (``qwen3_trn.rank``).
"""

from pathlib import Path

from qwen3_trn import backends, launch
from qwen3_trn.config.schema import RunConfig
from qwen3_trn.data import sources
from qwen3_trn.results import records

# The packages whose modules define the options' classes (imported above).
OPTION_PACKAGES = (backends, launch, sources)


def load_run_config(path: str | Path) -> RunConfig:
    """A run's saved config (``records.load_run_config``), typed by any option of its groups."""
    return records.load_run_config(path)


__all__ = ["OPTION_PACKAGES", "load_run_config"]
