"""Text sources for training and validation, chosen by ``data=<name>`` and registered with
torchtitan's dataset table: each is a ``DataSource`` class in a module of this package
(``embedded``, ``files``, ``hub``, ``c4``; what they share is ``base``) with its ``Config`` from
``qwen3_trn.config.option_schemas`` (registered in ``DataConfig.options``). Importing the package
imports every module, so each class becomes its Config's owner. A new source is one module here,
its Config there and its ``conf/data/<name>.yaml``.

Every source has a held-out split for validation (``resolve_validation_dataset``): the embedded
corpus ships one, c4 has torchtitan's ``c4_validation``, files and hub hold out documents
(``base.SplitSource``)."""

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
