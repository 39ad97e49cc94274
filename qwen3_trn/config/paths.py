"""Every path key, found by its kind (``keys.PathKind``), made absolute and checked.

Paths are made absolute against the command's directory, because ranks may start elsewhere and
torchtitan refuses a relative ``initial_load_path``. Only existence is checked here; what a file
holds is checked by its reader (``qwen3_trn.run.inputs``).
"""

from __future__ import annotations

import glob
import os
from pathlib import Path
from typing import Any, Callable, Iterator

from qwen3_trn.common.errors import ConfigError, grouped
from qwen3_trn.config.keys import PathKind, facts, leaves

# File suffix -> the `datasets` builder that reads it.
FILE_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".txt": "text"}
DATA_FILE_KINDS = "/".join(FILE_BUILDERS)


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
            f"'{pattern}' does not exist or matches no {DATA_FILE_KINDS} file "
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


def _exists(key: str, value: str, hint: str | None) -> None:
    if not Path(value).expanduser().exists():
        raise ConfigError(key, f"'{value}' does not exist; {hint or 'give an existing path'}.")


def _data_files(key: str, value: str, hint: str | None) -> None:
    local_data_files(value, key)


def _nothing(key: str, value: str, hint: str | None) -> None:
    """Not checked here: written by the run, or opened by its own loader (a hub id)."""


def _always(value: str) -> bool:
    return True


def _not_url(value: str) -> bool:
    return "://" not in value


def _exists_here(value: str) -> bool:
    return Path(value).expanduser().exists()


# Each kind: when a value is a local path, and its check (key, value, the key's hint).
KINDS: dict[PathKind, tuple[Callable[[str], bool], Callable[[str, str, str | None], None]]] = {
    PathKind.read: (_always, _exists),
    PathKind.data_files: (_always, _data_files),
    PathKind.read_unless_url: (_not_url, _exists),
    PathKind.local_or_hub_id: (_exists_here, _nothing),
    PathKind.written: (_always, _nothing),
}


def local_paths(cfg: Any) -> Iterator[tuple[str, Any, str, PathKind, str | None]]:
    """(dotted key, section, field name, kind, hint) of every path key naming a local path."""
    for dotted, field, value in leaves(cfg):
        kind = facts(field).path
        if kind is None or not value or not KINDS[kind][0](str(value)):
            continue
        section: Any = cfg
        for part in dotted.split(".")[:-1]:
            section = getattr(section, part)
        yield dotted, section, field.name, kind, facts(field).hint


def absolute_paths(cfg: Any, cwd: str | Path | None = None) -> Any:
    """Make every relative local path of ``cfg`` absolute against ``cwd``, in place."""
    base = Path(cwd or os.getcwd())
    for _, section, name, _, _ in list(local_paths(cfg)):
        path = Path(str(getattr(section, name))).expanduser()
        setattr(section, name, str(path if path.is_absolute() else base / path))
    return cfg


def path_problems(cfg: Any) -> list[ConfigError]:
    """A ``ConfigError`` for every local path the run reads that names nothing there."""
    problems = []
    for dotted, section, name, kind, hint in local_paths(cfg):
        try:
            KINDS[kind][1](dotted, str(getattr(section, name)), hint)
        except ConfigError as exc:
            problems.append(exc)
    return problems


def check_paths(cfg: Any) -> None:
    problems = path_problems(cfg)
    if problems:
        raise grouped(problems)
