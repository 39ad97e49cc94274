"""Text sources for training and validation, chosen by ``data=<name>``: one ``DataSource`` per
module (what they share: ``base``), registered by importing the package. A new source is one
module here, its Config in ``config.option_schemas`` and its ``conf/data/<name>.yaml``.
"""

from qwen3_trn.config.options import import_submodules
from qwen3_trn.data.sources.base import (
    DataSource,
    ResolvedDataset,
    data_source,
    held_out_indices,
    resolve_dataset,
    resolve_validation_dataset,
)

import_submodules(__name__, __path__)

__all__ = ["DataSource", "ResolvedDataset", "data_source", "held_out_indices", "resolve_dataset", "resolve_validation_dataset"]
