"""Text sources for training, registered with torchtitan's dataset table.

torchtitan's ``HuggingFaceTextDataLoader`` looks datasets up by name in
``torchtitan.hf_datasets.text_datasets.DATASETS``. Each source here turns a ``DataConfig``
into such an entry (named after the config, so registering is idempotent and every worker
process can repeat it) plus the ``dataset_path`` to pass along.
"""

from __future__ import annotations

import glob
import hashlib
import json
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable

from torchtitan.hf_datasets import DatasetConfig
from torchtitan.hf_datasets.text_datasets import DATASETS

from qwen3_trn.config.schema import DataConfig
from qwen3_trn.data.embedded import corpus_path, ensure_assets
from qwen3_trn.errors import ConfigError

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


def _register(data: DataConfig, path: str | None, loader: Callable, column: str) -> ResolvedDataset:
    digest = hashlib.sha1(json.dumps(asdict(data), sort_keys=True).encode()).hexdigest()[:10]
    name = f"qwen3_trn_{data.source}_{digest}"
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


def data_files(data: DataConfig) -> list[str]:
    """The files of ``data=files``, all of one kind the ``datasets`` library reads."""
    if not data.path:
        raise ConfigError("data.path", "data=files needs data.path=<file | directory | glob> of .jsonl/.json/.parquet/.txt files.")
    files = list_data_files(data.path)
    if not files:
        raise ConfigError(
            "data.path",
            f"'{data.path}' does not exist or matches no .jsonl/.json/.parquet/.txt file "
            f"(looked from {Path.cwd()}); pass an existing file, directory or glob.",
        )
    builders = {builder_of(f) for f in files}
    if None in builders:
        unknown = next(f for f in files if builder_of(f) is None)
        raise ConfigError(
            "data.path",
            f"'{unknown}' is not a format data=files reads; use .jsonl, .json, .parquet or .txt files (optionally .gz or .zst compressed).",
        )
    if len(builders) != 1:
        raise ConfigError("data.path", f"'{data.path}' mixes file types {sorted(builders)}; point it at one kind of file.")
    return files


def _files(data: DataConfig) -> ResolvedDataset:
    files = data_files(data)
    builder = builder_of(files[0])
    column = "text" if builder == "text" else data.text_column
    return _register(data, None, lambda _path: _load_files(files, builder, data.split), column)


def _embedded(data: DataConfig) -> ResolvedDataset:
    corpus = str(corpus_path(ensure_assets()))
    return _register(data, corpus, lambda path: _load_files([path], "json", "train"), "text")


def _hub(data: DataConfig) -> ResolvedDataset:
    if not data.path:
        raise ConfigError(
            "data.path", "data=hub needs data.path=<dataset id on the Hugging Face hub>, e.g. data.path=roneneldan/TinyStories."
        )
    return _register(data, data.path, partial(_load_hub, data.name, data.split, data.streaming), data.text_column)


def _c4(data: DataConfig) -> ResolvedDataset:
    name = {"train": "c4", "validation": "c4_validation"}.get(data.split)
    if name is None:
        raise ConfigError("data.split", f"c4 has splits train and validation, not '{data.split}'.")
    return ResolvedDataset(name=name, path=data.path)


DATA_SOURCES: dict[str, Callable[[DataConfig], ResolvedDataset]] = {
    "embedded": _embedded,
    "files": _files,
    "hub": _hub,
    "c4": _c4,
}


def resolve_dataset(data: DataConfig) -> ResolvedDataset:
    if data.source not in DATA_SOURCES:
        raise ConfigError("data.source", f"unknown source '{data.source}'; use one of {', '.join(DATA_SOURCES)}.")
    return DATA_SOURCES[data.source](data)
