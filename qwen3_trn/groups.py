"""Imports every implementation of the class-valued config groups (backends, launchers, data
sources), so each becomes its Config's ``_owner``. Composing a config needs none of them;
building a run's parts does.
"""

from pathlib import Path

from qwen3_trn import backends, launch
from qwen3_trn.config.schema import RunConfig
from qwen3_trn.data import sources
from qwen3_trn.results import records

# The packages whose modules define the options' classes (imported above).
OPTION_PACKAGES = (backends, launch, sources)


def load_run_config(path: str | Path) -> RunConfig:
    """A saved config typed by any option of its groups (for ``qwen3_trn.rank``)."""
    return records.load_run_config(path)


__all__ = ["OPTION_PACKAGES", "load_run_config"]
