"""What every data source shares: the ``DataSource`` interface, registration with torchtitan's
dataset table, and a held-out split for sources without one (docs/validation.md).

A source registers an entry of ``torchtitan.hf_datasets.text_datasets.DATASETS`` named after its
config, so registering is idempotent and every worker can repeat it. Held-out documents are
chosen deterministically (evenly spaced, or by a hash of the text when streamed), so runs over the
same data hold out the same ones. Training documents are shuffled by ``training.seed``; the
held-out split keeps its order, so every run is evaluated on the same tokens.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any, Callable, ClassVar

from qwen3_trn.common.errors import ConfigError
from qwen3_trn.config.option_schemas import SplitSourceConfig
from qwen3_trn.config.options import Configurable
from qwen3_trn.config.paths import builder_of, local_data_files
from qwen3_trn.config.schema import DataConfig, Mode
from qwen3_trn.titan import DATASETS, DatasetConfig

# Documents a streamed dataset shuffles among (Hugging Face's shuffle buffer).
STREAM_SHUFFLE_BUFFER = 1_000


@dataclass(frozen=True)
class ResolvedDataset:
    name: str
    path: str | None


def _pick_text(column: str, sample: dict[str, Any]) -> str:
    return sample[column]


def load_files(files: list[str], builder: str, split: str):
    from datasets import load_dataset

    return load_dataset(builder, data_files=files, split=split)


def held_out_indices(num_documents: int, fraction: float) -> list[int]:
    """``round(fraction * num_documents)`` document indices, evenly spaced over the dataset."""
    count = min(round(fraction * num_documents), num_documents)
    return [int((i + 0.5) * num_documents / count) for i in range(count)] if count > 0 else []


def _hashed_out(column: str, fraction: float, sample: dict[str, Any]) -> bool:
    return zlib.crc32(sample[column].encode("utf-8")) % 10_000 < round(fraction * 10_000)


def _hashed_in(column: str, fraction: float, sample: dict[str, Any]) -> bool:
    return not _hashed_out(column, fraction, sample)


def split_documents(dataset, fraction: float, column: str, held_out: bool):
    """The held-out part (``held_out=True``) or the rest of ``dataset``; order is kept."""
    if fraction <= 0:
        return dataset.select([]) if held_out and hasattr(dataset, "select") else dataset
    if not hasattr(dataset, "__len__"):  # streamed: decide per document, by its text
        return dataset.filter(partial(_hashed_out if held_out else _hashed_in, column, fraction))
    chosen = held_out_indices(len(dataset), fraction)
    if held_out:
        return dataset.select(chosen)
    skip = set(chosen)
    return dataset.select([i for i in range(len(dataset)) if i not in skip])


def _split_loaded(loader: Callable, fraction: float, column: str, held_out: bool, path: str | None):
    return split_documents(loader(path), fraction, column, held_out)


def register(data: DataConfig, path: str | None, loader: Callable, column: str, role: str = "train") -> ResolvedDataset:
    """``loader``'s documents (their ``column``) in torchtitan's dataset table, named after ``data``."""
    digest = hashlib.sha1(json.dumps(asdict(data), sort_keys=True).encode()).hexdigest()[:10]
    name = f"qwen3_trn_{data.name}_{digest}" + ("" if role == "train" else f"_{role}")
    DATASETS[name] = DatasetConfig(path=path, loader=loader, sample_processor=partial(_pick_text, column))
    return ResolvedDataset(name=name, path=path)


@dataclass(frozen=True)
class Documents:
    """A source's documents: torchtitan's ``dataset_path``, a loader and the text column."""

    path: str | None
    loader: Callable
    column: str


def local_files(files: list[str], text_column: str) -> Documents:
    builder = builder_of(files[0])
    return Documents(None, lambda _path: load_files(files, builder, "train"), "text" if builder == "text" else text_column)


class DataSource(Configurable):
    """A source of training text and its held-out split, chosen by ``data=<name>``."""

    Config: ClassVar[type[DataConfig]] = DataConfig
    config: DataConfig

    def dataset(self) -> ResolvedDataset:
        """The training split, registered with torchtitan."""
        raise NotImplementedError

    def validation_dataset(self) -> ResolvedDataset:
        """The held-out split, registered with torchtitan."""
        raise NotImplementedError

    def check(self, mode: Mode) -> None:
        """Checks in the parent before any worker starts (the data opened, its first records read);
        raise ConfigError."""


class SplitSource(DataSource):
    """A source split into training and held-out documents by ``data.val_fraction``, unless
    held-out documents are named (``data.val_path`` or the source's own)."""

    Config = SplitSourceConfig

    config: Config
    # The keys, besides data.val_path, that name held-out text of this source (an error lists them).
    held_out_keys: ClassVar[tuple[str, ...]] = ()

    def documents(self) -> Documents:
        raise NotImplementedError

    def own_held_out(self) -> Documents | None:
        """Held-out documents the source names itself (None: none)."""
        return None

    def _named_held_out(self) -> Documents | None:
        """data.val_path's files, else what the source names itself."""
        data = self.config
        if data.val_path:
            return local_files(local_data_files(data.val_path, "data.val_path"), data.text_column)
        return self.own_held_out()

    def dataset(self) -> ResolvedDataset:
        docs = self.documents()
        loader = docs.loader
        if self._named_held_out() is None:  # no separate held-out text: leave val_fraction out
            loader = partial(_split_loaded, docs.loader, self.config.val_fraction, docs.column, False)
        return register(self.config, docs.path, loader, docs.column)

    def validation_dataset(self) -> ResolvedDataset:
        data = self.config
        docs = self._named_held_out()
        if docs is None:
            if data.val_fraction <= 0:
                named = "".join(f" or {key}" for key in self.held_out_keys)
                raise ConfigError(
                    "data.val_fraction",
                    f"validation needs held-out text, but data={data.name} has no data.val_path{named} and data.val_fraction "
                    "is 0; set one of them (e.g. data.val_fraction=0.01), or validation=off.",
                )
            docs = self.documents()
            docs = Documents(docs.path, partial(_split_loaded, docs.loader, data.val_fraction, docs.column, True), docs.column)
        return register(data, docs.path, docs.loader, docs.column, role="val")


def data_source(data: DataConfig) -> DataSource:
    if data.name not in DataConfig.options:
        raise ConfigError("data.name", f"unknown data source '{data.name}'; use one of {', '.join(DataConfig.options)}.")
    return data.build()


def _shuffled(loader: Callable, seed: int, path: str | None):
    documents = loader(path)
    if hasattr(documents, "__len__"):
        return documents.shuffle(seed=seed, keep_in_memory=True)
    return documents.shuffle(seed=seed, buffer_size=STREAM_SHUFFLE_BUFFER)


def resolve_dataset(data: DataConfig, seed: int) -> ResolvedDataset:
    """The training split, its documents in the order ``seed`` shuffles them into."""
    resolved = data_source(data).dataset()
    entry = DATASETS[resolved.name]
    name = f"{resolved.name}_seed{seed}"
    DATASETS[name] = DatasetConfig(path=entry.path, loader=partial(_shuffled, entry.loader, seed), sample_processor=entry.sample_processor)
    return ResolvedDataset(name=name, path=resolved.path)


def resolve_validation_dataset(data: DataConfig) -> ResolvedDataset:
    return data_source(data).validation_dataset()
