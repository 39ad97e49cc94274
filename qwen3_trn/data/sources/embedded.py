"""``data=embedded``: the text shipped with the project, with its own held-out split; trains offline."""

from __future__ import annotations

from qwen3_trn.config.option_schemas import EmbeddedSourceConfig
from qwen3_trn.data.embedded import corpus_path, ensure_assets, validation_corpus_path
from qwen3_trn.data.sources.base import DataSource, ResolvedDataset, load_files, register


def _load_json(path: str):
    return load_files([path], "json", "train")


class EmbeddedSource(DataSource):
    Config = EmbeddedSourceConfig

    def dataset(self) -> ResolvedDataset:
        return register(self.config, str(corpus_path(ensure_assets())), _load_json, "text")

    def validation_dataset(self) -> ResolvedDataset:
        return register(self.config, str(validation_corpus_path(ensure_assets())), _load_json, "text", role="val")
