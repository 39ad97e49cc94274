"""Text sources for training and validation, registered with torchtitan's dataset table.

torchtitan's ``HuggingFaceTextDataLoader`` looks datasets up by name in
``torchtitan.hf_datasets.text_datasets.DATASETS``. Each source here turns a ``DataConfig``
into such an entry (named after the config, so registering is idempotent and every worker
process can repeat it) plus the ``dataset_path`` to pass along.

Every source has a held-out split for validation (``resolve_validation_dataset``): the
embedded corpus ships one, c4 has torchtitan's ``c4_validation``; files and hub sources take
``data.val_path`` (local files), ``data.val_split`` (hub) or, failing both, hold out
``data.val_fraction`` of their documents, which the training split then leaves out. The
held-out documents are chosen deterministically (evenly spaced in a map-style dataset, by a
hash of the text in a streamed one), so every run over the same data holds out the same ones.
"""

from __future__ import annotations

import glob
import hashlib
import json
import zlib
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable

from qwen3_trn.config.schema import C4DataConfig, DataConfig, EmbeddedDataConfig, FilesDataConfig, HubDataConfig
from qwen3_trn.data.embedded import corpus_path, ensure_assets, validation_corpus_path
from qwen3_trn.errors import ConfigError
from qwen3_trn.titan import DATASETS, DatasetConfig

# File suffix -> the `datasets` builder that reads it.
FILE_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".txt": "text"}


@dataclass(frozen=True)
class ResolvedDataset:
    name: str
    path: str | None


def _pick_text(column: str, sample: dict[str, Any]) -> str:
    return sample[column]


def _load_files(files: list[str], builder: str, split: str):
    from datasets import load_dataset

    return load_dataset(builder, data_files=files, split=split)


def _load_hub(name: str | None, split: str, streaming: bool, path: str):
    from datasets import load_dataset

    return load_dataset(path, name=name, split=split, streaming=streaming)


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


def _register(data: DataConfig, path: str | None, loader: Callable, column: str, role: str = "train") -> ResolvedDataset:
    digest = hashlib.sha1(json.dumps(asdict(data), sort_keys=True).encode()).hexdigest()[:10]
    name = f"qwen3_trn_{data.source}_{digest}" + ("" if role == "train" else f"_{role}")
    DATASETS[name] = DatasetConfig(path=path, loader=loader, sample_processor=partial(_pick_text, column))
    return ResolvedDataset(name=name, path=path)


def list_data_files(pattern: str) -> list[str]:
    candidate = Path(pattern).expanduser()
    if candidate.is_dir():
        files = sorted(str(p) for p in candidate.rglob("*") if p.is_file() and builder_of(str(p)))
    elif any(ch in pattern for ch in "*?["):
        files = sorted(glob.glob(str(candidate), recursive=True))
    else:
        files = [str(candidate)] if candidate.is_file() else []
    return files


def builder_of(file: str) -> str | None:
    """The builder for a file, looking through a compression suffix (``a.jsonl.gz``)."""
    uncompressed = file.removesuffix(".gz").removesuffix(".zst")
    return FILE_BUILDERS.get(Path(uncompressed).suffix)


def local_data_files(pattern: str, key: str = "data.path") -> list[str]:
    """The files ``pattern`` names, all of one kind the ``datasets`` library reads."""
    files = list_data_files(pattern)
    if not files:
        raise ConfigError(
            key,
            f"'{pattern}' does not exist or matches no .jsonl/.json/.parquet/.txt file "
            f"(looked from {Path.cwd()}); pass an existing file, directory or glob.",
        )
    builders = {builder_of(f) for f in files}
    if None in builders:
        unknown = next(f for f in files if builder_of(f) is None)
        raise ConfigError(
            key,
            f"'{unknown}' is not a format data=files reads; use .jsonl, .json, .parquet or .txt files (optionally .gz or .zst compressed).",
        )
    if len(builders) != 1:
        raise ConfigError(key, f"'{pattern}' mixes file types {sorted(builders)}; point it at one kind of file.")
    return files


def data_files(data: FilesDataConfig) -> list[str]:
    """The files of ``data=files``."""
    if not data.path:
        raise ConfigError("data.path", "data=files needs data.path=<file | directory | glob> of .jsonl/.json/.parquet/.txt files.")
    return local_data_files(data.path)


@dataclass(frozen=True)
class _Documents:
    """Where a source's documents come from: torchtitan's ``dataset_path``, a loader, the text column."""

    path: str | None
    loader: Callable
    column: str


def _local_files(files: list[str], text_column: str) -> _Documents:
    builder = builder_of(files[0])
    return _Documents(None, lambda _path: _load_files(files, builder, "train"), "text" if builder == "text" else text_column)


def _files_documents(data: FilesDataConfig) -> _Documents:
    return _local_files(data_files(data), data.text_column)


def _hub_documents(data: HubDataConfig, split: str | None = None) -> _Documents:
    if not data.path:
        raise ConfigError(
            "data.path", "data=hub needs data.path=<dataset id on the Hugging Face hub>, e.g. data.path=roneneldan/TinyStories."
        )
    return _Documents(data.path, partial(_load_hub, data.name, split or data.split, data.streaming), data.text_column)


def _hub_split(data: HubDataConfig) -> _Documents | None:
    return _hub_documents(data, split=data.val_split) if data.val_split else None


# Sources whose documents are split into training and held-out parts by data.val_fraction,
# and the held-out documents they may name instead (data.val_path, for hub also data.val_split).
SPLITTABLE: dict[str, Callable[[Any], _Documents]] = {"files": _files_documents, "hub": _hub_documents}
NAMED_HELD_OUT: dict[str, Callable[[Any], _Documents | None]] = {"files": lambda data: None, "hub": _hub_split}


def _val_files(data: FilesDataConfig | HubDataConfig) -> _Documents | None:
    if not data.val_path:
        return None
    return _local_files(local_data_files(data.val_path, "data.val_path"), data.text_column)


def _named_held_out(data: FilesDataConfig | HubDataConfig) -> _Documents | None:
    """data.val_path's files, else what the source names itself (hub: data.val_split)."""
    return _val_files(data) or NAMED_HELD_OUT[data.source](data)


def _split_source(data: FilesDataConfig | HubDataConfig) -> ResolvedDataset:
    docs = SPLITTABLE[data.source](data)
    loader = docs.loader
    if _named_held_out(data) is None:  # no separate held-out text: leave val_fraction out
        loader = partial(_split_loaded, docs.loader, data.val_fraction, docs.column, False)
    return _register(data, docs.path, loader, docs.column)


def _embedded(data: EmbeddedDataConfig) -> ResolvedDataset:
    corpus = str(corpus_path(ensure_assets()))
    return _register(data, corpus, lambda path: _load_files([path], "json", "train"), "text")


def _c4(data: C4DataConfig) -> ResolvedDataset:
    name = {"train": "c4", "validation": "c4_validation"}.get(data.split)
    if name is None:
        raise ConfigError("data.split", f"c4 has splits train and validation, not '{data.split}'.")
    return ResolvedDataset(name=name, path=data.path)


DATA_SOURCES: dict[str, Callable[[Any], ResolvedDataset]] = {
    "embedded": _embedded,
    "files": _split_source,
    "hub": _split_source,
    "c4": _c4,
}


def _embedded_validation(data: EmbeddedDataConfig) -> ResolvedDataset:
    corpus = str(validation_corpus_path(ensure_assets()))
    return _register(data, corpus, lambda path: _load_files([path], "json", "train"), "text", role="val")


def _c4_validation(data: C4DataConfig) -> ResolvedDataset:
    return ResolvedDataset(name="c4_validation", path=None)


def _split_validation(data: FilesDataConfig | HubDataConfig) -> ResolvedDataset:
    docs = _named_held_out(data)
    if docs is None:
        if data.val_fraction <= 0:
            raise ConfigError(
                "data.val_fraction",
                f"validation needs held-out text, but data={data.source} has no data.val_path"
                + (" or data.val_split" if data.source == "hub" else "")
                + " and data.val_fraction is 0; set one of them (e.g. data.val_fraction=0.01), or validation=off.",
            )
        docs = SPLITTABLE[data.source](data)
        docs = _Documents(docs.path, partial(_split_loaded, docs.loader, data.val_fraction, docs.column, True), docs.column)
    return _register(data, docs.path, docs.loader, docs.column, role="val")


VALIDATION_SOURCES: dict[str, Callable[[Any], ResolvedDataset]] = {
    "embedded": _embedded_validation,
    "files": _split_validation,
    "hub": _split_validation,
    "c4": _c4_validation,
}


def _check_source(data: DataConfig) -> None:
    if data.source not in DATA_SOURCES:
        raise ConfigError("data.source", f"unknown source '{data.source}'; use one of {', '.join(DATA_SOURCES)}.")


def resolve_dataset(data: DataConfig) -> ResolvedDataset:
    _check_source(data)
    return DATA_SOURCES[data.source](data)


def resolve_validation_dataset(data: DataConfig) -> ResolvedDataset:
    """The held-out split of the data source (see the module docstring)."""
    _check_source(data)
    return VALIDATION_SOURCES[data.source](data)
