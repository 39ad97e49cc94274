"""The run's inputs, checked in the parent before any worker starts.

- ``absolute_paths``: every path key, relative or absolute, resolved against the directory the
  command ran in, so that ranks (which may start elsewhere: a Slurm node, torchrun) and
  torchtitan (which refuses a relative ``initial_load_path``) get absolute paths;
- ``check_data``: the data source opened here and its first records read, the way the ranks'
  loader reads them (the same ``datasets`` builder): a missing path, no records, bytes that are
  not text, a format the builder cannot read, a text column the records lack;
- ``check_tokenizer``: the tokenizer directory's JSON files parse (line and column when not),
  torchtitan's tokenizer loads from it, and its vocabulary fits the model and its config.json.
"""

from __future__ import annotations

import codecs
import gzip
import itertools
import json
import logging
import os
from pathlib import Path
from typing import Any, Callable

from datasets import load_dataset, load_dataset_builder

from qwen3_trn.config.files import read_json_file
from qwen3_trn.config.schema import DataConfig, Mode, RunConfig
from qwen3_trn.data.sources import builder_of, data_files
from qwen3_trn.errors import ConfigError
from qwen3_trn.quiet import logging_disabled

# How many records of the data are read before the ranks start.
PROBED_RECORDS = 8
# How much of a file is read to say where it is not text or not JSON.
PROBED_BYTES = 1 << 20


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0].rstrip(".") if text else type(exc).__name__


# ------------------------------------------------------------------------------------------
# Paths
# ------------------------------------------------------------------------------------------


def _if_local(value: str) -> bool:
    return Path(value).expanduser().exists()


# Path keys, and when their value is a path (a hub id is not). A key the chosen option of its
# group lacks (data.val_path with data=embedded) is skipped.
PATH_KEYS: dict[str, Callable[[RunConfig, str], bool]] = {
    "model.hf_assets_path": lambda cfg, value: True,
    "model.hf_model": lambda cfg, value: _if_local(value),
    "data.path": lambda cfg, value: cfg.data.source == "files" or _if_local(value),
    "data.val_path": lambda cfg, value: True,
    "checkpoint.resume_from": lambda cfg, value: True,
    "checkpoint.initial_load_path": lambda cfg, value: "://" not in value,
    "logger.wandb.dir": lambda cfg, value: True,
}


def absolute_paths(cfg: RunConfig, cwd: str | Path | None = None) -> RunConfig:
    """``cfg`` (changed in place) with every relative path key made absolute against ``cwd``
    (the directory the command ran in)."""
    base = Path(cwd or os.getcwd())
    for key, is_path in PATH_KEYS.items():
        section_name, name = key.rsplit(".", 1)
        section: Any = cfg
        for part in section_name.split("."):
            section = getattr(section, part)
        value = getattr(section, name, None)
        if value and is_path(cfg, str(value)):
            path = Path(str(value)).expanduser()
            setattr(section, name, str(path if path.is_absolute() else base / path))
    return cfg


# ------------------------------------------------------------------------------------------
# Data
# ------------------------------------------------------------------------------------------


def _head(file: str) -> bytes:
    opener = gzip.open if file.endswith(".gz") else open
    with opener(file, "rb") as f:
        return f.read(PROBED_BYTES)


def _not_text(file: str, head: bytes) -> str | None:
    decoder = codecs.getincrementaldecoder("utf-8")()
    try:
        decoder.decode(head, final=False)
    except UnicodeDecodeError as exc:
        return f"{file} is not text: byte 0x{head[exc.start]:02x} at offset {exc.start} is not UTF-8 (a binary file?)"
    return None


def _not_json(file: str, text: str) -> str | None:
    """Where the first records of a JSON (Lines) file fail to parse."""
    stripped = text.lstrip()
    if file.removesuffix(".gz").endswith(".json") and stripped.startswith("["):
        try:
            json.loads(text)
        except json.JSONDecodeError as exc:
            if exc.pos < len(text) - 1:  # not just the end of the part read here
                return f"{file}, line {exc.lineno}, column {exc.colno}: not valid JSON ({exc.msg})"
        return None
    for number, line in enumerate(text.splitlines()[:PROBED_RECORDS], start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            return f"{file}, line {number}, column {exc.colno}: not valid JSON ({exc.msg}); each line must be one JSON object"
        if not isinstance(record, dict):
            return f"{file}, line {number}: a JSON {type(record).__name__}, not an object with a text column"
    return None


def _why_unreadable(files: list[str], builder: str, exc: BaseException) -> str:
    for file in files:
        if os.path.getsize(file) == 0:
            continue
        try:
            head = _head(file)
        except OSError as err:  # e.g. a .gz that is not gzip
            return f"{file} cannot be read ({err})"
        problem = _not_text(file, head) if builder in ("json", "text") else None
        if problem is None and builder == "json":
            problem = _not_json(file, head.decode("utf-8", errors="replace"))
        if problem:
            return problem
    return f"the '{builder}' reader of the datasets library cannot read {files[0]}{' (and the rest)' if len(files) > 1 else ''}: {_first_line(exc)}"


def first_records(data: DataConfig, files: list[str], builder: str) -> list[dict[str, Any]]:
    """The first records of ``files`` as the ranks' loader reads them."""
    if all(os.path.getsize(f) == 0 for f in files):
        return []
    try:
        with logging_disabled(logging.CRITICAL):
            stream = load_dataset(builder, data_files=files, split="train", streaming=True)
            return list(itertools.islice(stream, PROBED_RECORDS))
    except Exception as exc:  # noqa: BLE001 - pyarrow, pandas, json and UnicodeDecodeError alike
        raise ConfigError(
            "data.path",
            f"{_why_unreadable(files, builder, exc)}; point data.path at .jsonl/.json/.parquet/.txt files the datasets library reads.",
        ) from None


def _check_records(data: DataConfig, records: list[dict[str, Any]], files: list[str], column: str) -> None:
    if not records:
        empty = "is empty" if len(files) == 1 else f"are {len(files)} files without a record"
        raise ConfigError("data.path", f"'{data.path}' {empty}: there is nothing to train on; point data.path at files with records.")
    lacking = next((r for r in records if column not in r), None)
    if lacking is not None:
        raise ConfigError(
            "data.text_column",
            f"'{column}' is not a column of {files[0]}: its records have {', '.join(sorted(map(str, lacking)))}; "
            "set data.text_column=<the column with the text>.",
        )
    wrong = next((r[column] for r in records if not isinstance(r[column], str)), None)
    if wrong is not None:
        raise ConfigError(
            "data.text_column",
            f"column '{column}' of {files[0]} holds {type(wrong).__name__} values, not text; set data.text_column to a column of strings.",
        )


def _check_files(cfg: RunConfig) -> None:
    data = cfg.data
    files = data_files(data)
    builder = builder_of(files[0])
    column = "text" if builder == "text" else data.text_column
    _check_records(data, first_records(data, files, builder), files, column)


def _check_hub(cfg: RunConfig) -> None:
    if cfg.mode != Mode.train:
        return  # planning needs no network
    data = cfg.data
    try:
        with logging_disabled(logging.CRITICAL):
            builder = load_dataset_builder(data.path, name=data.name)
    except Exception as exc:  # noqa: BLE001 - hub, network and cache errors alike
        reason = _first_line(exc)
        offline = " (HF_DATASETS_OFFLINE is set: only the local cache was searched)" if os.environ.get("HF_DATASETS_OFFLINE") else ""
        raise ConfigError(
            "data.path",
            f"cannot open the hub dataset '{data.path}'{offline}: {reason}; check the id, the network and HF_TOKEN for gated datasets.",
        ) from None
    features = builder.info.features
    if features is not None and data.text_column not in features:
        raise ConfigError(
            "data.text_column",
            f"'{data.text_column}' is not a column of '{data.path}': it has "
            f"{', '.join(features)}; set data.text_column=<the column with the text>.",
        )


# Checks of each data source (``qwen3_trn.data.sources.DATA_SOURCES``); the shipped corpus and
# torchtitan's c4 need none.
DATA_CHECKS: dict[str, Callable[[RunConfig], None]] = {"files": _check_files, "hub": _check_hub}


def check_data(cfg: RunConfig) -> None:
    check = DATA_CHECKS.get(cfg.data.source)
    if check is not None:
        check(cfg)


# ------------------------------------------------------------------------------------------
# Tokenizer and HF files
# ------------------------------------------------------------------------------------------

TOKENIZER_KEY = "model.hf_assets_path"
JSON_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "special_tokens_map.json", "config.json")


def check_tokenizer(path: str | Path, build: Callable[[str], Any], vocab_size: int) -> None:
    """``build(path)`` is the tokenizer the ranks build (torchtitan's, from the Trainer.Config)."""
    path = Path(path)
    if not path.is_dir():
        raise ConfigError(TOKENIZER_KEY, f"'{path}' is not a directory; point it at a folder holding tokenizer.json (HF assets).")
    if not any((path / name).is_file() for name in ("tokenizer.json", "vocab.json", "vocab.txt")):
        raise ConfigError(
            TOKENIZER_KEY,
            f"'{path}' holds no tokenizer (no tokenizer.json or vocab.json); download the model's HF assets "
            "there, or leave model.hf_assets_path unset to use the tokenizer the project ships.",
        )
    parsed = {name: read_json_file(path / name, TOKENIZER_KEY, name) for name in JSON_FILES if (path / name).is_file()}
    try:
        with logging_disabled(logging.CRITICAL):
            tokenizer = build(str(path))
    except Exception as exc:  # noqa: BLE001 - the tokenizers library's own errors
        raise ConfigError(
            TOKENIZER_KEY,
            f"torchtitan cannot load the tokenizer in '{path}': {_first_line(exc)}; replace its tokenizer files with the model's own.",
        ) from None
    vocab = tokenizer.tokenizer.get_vocab(with_added_tokens=True) if hasattr(tokenizer, "tokenizer") else {}
    size = max(vocab.values()) + 1 if vocab else tokenizer.get_vocab_size()
    if size > vocab_size:
        raise ConfigError(
            "model.vocab_size",
            f"the tokenizer in '{path}' has {size} tokens but the model's vocab_size is {vocab_size}; "
            f"set model.vocab_size>={size} or use a matching tokenizer.",
        )
    declared = (parsed.get("config.json") or {}).get("vocab_size") if isinstance(parsed.get("config.json"), dict) else None
    if isinstance(declared, int) and declared < size:
        raise ConfigError(
            TOKENIZER_KEY,
            f"{path / 'config.json'} says vocab_size {declared}, but the tokenizer there has {size} tokens; "
            "the two files come from different models: use the model's own files.",
        )
