"""``data=c4``: torchtitan's own C4 entries (``c4``, ``c4_validation``)."""

from __future__ import annotations

from qwen3_trn.common.errors import ConfigError
from qwen3_trn.config.option_schemas import C4SourceConfig
from qwen3_trn.data.sources.base import DataSource, ResolvedDataset

# data.split -> torchtitan's dataset of it
C4_SPLITS = {"train": "c4", "validation": "c4_validation"}


class C4Source(DataSource):
    Config = C4SourceConfig

    config: Config

    def dataset(self) -> ResolvedDataset:
        name = C4_SPLITS.get(self.config.split)
        if name is None:
            raise ConfigError("data.split", f"c4 has splits train and validation, not '{self.config.split}'.")
        return ResolvedDataset(name=name, path=self.config.path)

    def validation_dataset(self) -> ResolvedDataset:
        return ResolvedDataset(name=C4_SPLITS["validation"], path=None)
