"""Offline wandb runs read back without a server, in wandb's own record format.

An offline run is one ``run-<id>.wandb`` file: wandb's transaction log of
``wandb.proto.wandb_internal_pb2.Record`` messages, framed like a LevelDB log (a 7-byte file
header ``:W&B`` + magic 0xBEE1 + version; then 32 KiB blocks of chunks, each with a 7-byte
header: crc32 of type+data, length, type FULL/FIRST/MIDDLE/LAST). wandb 0.31 no longer ships a
Python reader for it (its Go core reads it; ``wandb leet inspect --json`` prints it); the
records themselves are parsed with wandb's own protobuf classes.
"""

from __future__ import annotations

import json
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

HEADER = struct.Struct("<4sHB")
HEADER_IDENT = b":W&B"
HEADER_MAGIC = 0xBEE1
BLOCK_LEN = 32768
CHUNK = struct.Struct("<IHB")
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4
_TYPE_CRC = {t: zlib.crc32(bytes([t])) & 0xFFFFFFFF for t in (FULL, FIRST, MIDDLE, LAST)}


class WandbFileError(ValueError):
    pass


def iter_record_bytes(path: Path) -> Iterator[bytes]:
    """The serialized records of a .wandb file, in order (a torn last record is dropped)."""
    data = Path(path).read_bytes()
    if len(data) < HEADER.size:
        raise WandbFileError(f"{path}: too short for a wandb run file")
    ident, magic, _version = HEADER.unpack_from(data, 0)
    if ident != HEADER_IDENT or magic != HEADER_MAGIC:
        raise WandbFileError(f"{path}: not a wandb run file (header {data[:7]!r})")
    pos, pending = HEADER.size, b""
    while pos + CHUNK.size <= len(data):
        left = BLOCK_LEN - pos % BLOCK_LEN
        if left < CHUNK.size:  # block trailer: zero padding
            pos += left
            continue
        checksum, length, kind = CHUNK.unpack_from(data, pos)
        pos += CHUNK.size
        chunk = data[pos : pos + length]
        pos += length
        if kind not in _TYPE_CRC or len(chunk) < length:
            break  # a run still being written, or padding
        if zlib.crc32(chunk, _TYPE_CRC[kind]) & 0xFFFFFFFF != checksum:
            raise WandbFileError(f"{path}: checksum mismatch at byte {pos - length}")
        if kind == FULL:
            yield chunk
        elif kind == FIRST:
            pending = chunk
        elif kind == MIDDLE:
            pending += chunk
        else:
            yield pending + chunk
            pending = b""


def iter_records(path: Path) -> Iterator[Any]:
    from wandb.proto import wandb_internal_pb2

    for raw in iter_record_bytes(path):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        yield record


def _item_key(item: Any) -> list[str]:
    return [item.key] if item.key else list(item.nested_key)


def _set_nested(target: dict[str, Any], keys: list[str], value: Any) -> None:
    for key in keys[:-1]:
        target = target.setdefault(key, {})
    target[keys[-1]] = value


@dataclass
class OfflineRun:
    path: Path
    id: str = ""
    project: str = ""
    entity: str = ""
    name: str = ""
    group: str = ""
    job_type: str = ""
    tags: list[str] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    exit_code: int | None = None


def read_offline_run(path: Path) -> OfflineRun:
    """Run settings, config, per-step history and summary of one ``run-<id>.wandb`` file."""
    run = OfflineRun(path=Path(path))
    for record in iter_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            r = record.run
            run.id, run.project, run.entity = r.run_id, r.project, r.entity
            run.name, run.group, run.job_type = r.display_name, r.run_group, r.job_type
            run.tags = list(r.tags)
            for item in r.config.update:
                _set_nested(run.config, _item_key(item), json.loads(item.value_json))
        elif kind == "config":
            for item in record.config.update:
                _set_nested(run.config, _item_key(item), json.loads(item.value_json))
        elif kind == "history":
            row: dict[str, Any] = {}
            for item in record.history.item:
                row["/".join(_item_key(item))] = json.loads(item.value_json)
            if record.history.HasField("step"):
                row.setdefault("_step", record.history.step.num)
            run.history.append(row)
        elif kind == "summary":
            for item in record.summary.update:
                _set_nested(run.summary, _item_key(item), json.loads(item.value_json))
        elif kind == "exit":
            run.exit_code = record.exit.exit_code
    run.config.pop("_wandb", None)
    return run


def find_run_files(run_dir: Path) -> list[Path]:
    """The .wandb files of the offline (or synced) wandb runs inside a run directory."""
    base = Path(run_dir)
    found = [p for p in base.glob("wandb/*run-*/run-*.wandb") if not p.parent.is_symlink()]  # not latest-run
    return sorted(found, key=lambda p: p.stat().st_mtime)
