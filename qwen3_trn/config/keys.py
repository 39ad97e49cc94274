"""Each config key's facts, declared on its schema field.

``key(default, ge=1, path=PathKind.read, hint="...")`` is a dataclass field whose metadata holds
the key's ``KeyFacts``: its range (checked by ``ranges``), what a path names (``paths``) and what
to give when it has no value (``hint``). A new key is one line of its schema.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from enum import Enum
from typing import Any, Callable, Iterator

from qwen3_trn.config.options import OptionConfig

Bound = float | str | None

BOUND_NAMES = ("ge", "gt", "le", "lt")


@dataclass(frozen=True)
class Range:
    """A number's valid range; a bound is a number or another key (``le="training.steps"``)."""

    ge: Bound = None
    gt: Bound = None
    le: Bound = None
    lt: Bound = None
    # Values accepted outside the bounds, and what they mean ("-1: the rest").
    allow: tuple[Any, ...] = ()
    exclude: tuple[Any, ...] = ()
    note: str = ""

    def bounds(self) -> list[tuple[str, Bound]]:
        return [(name, getattr(self, name)) for name in BOUND_NAMES if getattr(self, name) is not None]


class PathKind(str, Enum):
    """What a path key names; how each kind is made absolute and checked: ``paths``."""

    # a file or directory the run reads
    read = "read"
    # data files: a file, a directory or a glob of .jsonl/.json/.parquet/.txt files
    data_files = "data_files"
    # read, unless a URL (``scheme://...``) that the reader opens itself
    read_unless_url = "read_unless_url"
    # a local path where one exists, else a Hugging Face hub id (its loader checks it)
    local_or_hub_id = "local_or_hub_id"
    # a directory the run writes
    written = "written"


@dataclass(frozen=True)
class KeyFacts:
    range: Range | None = None
    path: PathKind | None = None
    # What to give when the key has no value (``???``) or names nothing that exists.
    hint: str | None = None


METADATA_KEY = "qwen3_trn"
NO_FACTS = KeyFacts()


def key(
    default: Any = dataclasses.MISSING,
    *,
    factory: Callable[[], Any] | None = None,
    ge: Bound = None,
    gt: Bound = None,
    le: Bound = None,
    lt: Bound = None,
    allow: tuple[Any, ...] = (),
    exclude: tuple[Any, ...] = (),
    note: str = "",
    path: PathKind | None = None,
    hint: str | None = None,
) -> Any:
    """A schema field with its facts: ``key(1, ge=1)``, ``key(None, path=PathKind.read, hint=...)``."""
    bounded = any(bound is not None for bound in (ge, gt, le, lt)) or allow or exclude
    rule = Range(ge=ge, gt=gt, le=le, lt=lt, allow=allow, exclude=exclude, note=note) if bounded else None
    metadata = {METADATA_KEY: KeyFacts(range=rule, path=path, hint=hint)}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def facts(field: dataclasses.Field) -> KeyFacts:
    return field.metadata.get(METADATA_KEY, NO_FACTS)


def field_named(cls: type, name: str) -> dataclasses.Field | None:
    return next((f for f in dataclasses.fields(cls) if f.name == name), None)


def hint_of(cls: type, name: str) -> str | None:
    """What to give for key ``name`` of ``cls`` when it has no value."""
    field = field_named(cls, name)
    return facts(field).hint if field is not None else None


def default_of(field: dataclasses.Field) -> Any:
    """The field's default (a factory's result; None without one)."""
    return None if field.default is dataclasses.MISSING else field.default


def leaves(node: Any, prefix: str = "") -> Iterator[tuple[str, dataclasses.Field, Any]]:
    """(dotted key, field, value) of every leaf of a typed config; a group with a schema per option
    holds the chosen option's keys."""
    for field in dataclasses.fields(node):
        value, dotted = getattr(node, field.name), f"{prefix}{field.name}"
        if dataclasses.is_dataclass(value):
            yield from leaves(value, f"{dotted}.")
        else:
            yield dotted, field, value


def _unwrapped(hint: Any) -> Any:
    """``int`` of ``Optional[int]``."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if typing.get_origin(hint) is typing.Union and len(args) == 1 else hint


def schema_fields(cls: type, prefix: str = "") -> Iterator[tuple[str, dataclasses.Field]]:
    """(dotted key, field) of every key a config of ``cls`` may hold: for a group with a schema per
    option, every registered option's keys, each once."""
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        hint, dotted = _unwrapped(hints[field.name]), f"{prefix}{field.name}"
        if isinstance(hint, type) and issubclass(hint, OptionConfig):
            seen: set[str] = set()
            for option in hint.registered().values():
                for found, option_field in schema_fields(option, f"{dotted}."):
                    if found not in seen:
                        seen.add(found)
                        yield found, option_field
        elif isinstance(hint, type) and dataclasses.is_dataclass(hint):
            yield from schema_fields(hint, f"{dotted}.")
        else:
            yield dotted, field
