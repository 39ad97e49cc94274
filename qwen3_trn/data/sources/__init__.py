"""Text sources for training and validation, chosen by ``data=<name>`` and registered with
torchtitan's dataset table: each is a ``DataSource`` class with a nested ``Config`` in a module of
this package (``embedded``, ``files``, ``hub``, ``c4``; what they share is ``base``). Importing
the package imports every module, so each source registers itself in ``DataConfig.options``. A
new source is one module here plus its ``conf/data/<name>.yaml``.

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
