"""``data=files``: local text files (.jsonl/.json/.parquet/.txt, optionally .gz or .zst), checked
in the parent the way the ranks' loader reads them: a missing path, no records, bytes that are not
text, a format the builder cannot read, a text column the records lack."""

from __future__ import annotations

import codecs
import gzip
import itertools
import json
import logging
import os
from typing import Any

from datasets import load_dataset

from qwen3_trn.common.errors import ConfigError, first_line
from qwen3_trn.common.quiet import logging_disabled
from qwen3_trn.config.keys import hint_of
from qwen3_trn.config.option_schemas import FilesSourceConfig
from qwen3_trn.config.schema import Mode
from qwen3_trn.data.sources.base import Documents, SplitSource, builder_of, local_data_files, local_files

# How many records of the data are read before the ranks start.
PROBED_RECORDS = 8
# How much of a file is read to say where it is not text or not JSON.
PROBED_BYTES = 1 << 20


def data_files(data: FilesSource.Config) -> list[str]:
    if not data.path:
        raise ConfigError("data.path", f"{hint_of(FilesSourceConfig, 'path')}.")
    return local_data_files(data.path)


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
    return f"the '{builder}' reader of the datasets library cannot read {files[0]}{' (and the rest)' if len(files) > 1 else ''}: {first_line(exc)}"


def first_records(files: list[str], builder: str) -> list[dict[str, Any]]:
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


def _check_records(data: FilesSource.Config, records: list[dict[str, Any]], files: list[str], column: str) -> None:
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


class FilesSource(SplitSource):
    Config = FilesSourceConfig

    config: Config

    def documents(self) -> Documents:
        return local_files(data_files(self.config), self.config.text_column)

    def check(self, mode: Mode) -> None:
        data = self.config
        files = data_files(data)
        builder = builder_of(files[0])
        column = "text" if builder == "text" else data.text_column
        _check_records(data, first_records(files, builder), files, column)
