"""The escape hatch: ``+titan.<dotted.path>=<value>`` sets any torchtitan ``Trainer.Config``
field. Paths are checked against the real dataclasses; a wrong one names the closest.
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any, Iterator

from qwen3_trn.common.errors import ConfigError


def flatten(tree: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in tree.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict) and value:
            yield from flatten(value, path)
        else:
            yield path, value


def _field_names(obj: Any) -> list[str]:
    return [f.name for f in dataclasses.fields(obj) if not f.name.startswith("_")]


def apply_titan_overrides(config: Any, overrides: dict[str, Any]) -> list[str]:
    """Set each dotted path on ``config`` (a Trainer.Config); returns the paths applied."""
    applied = []
    for path, value in flatten(overrides):
        target, parts = config, path.split(".")
        for depth, part in enumerate(parts):
            if not dataclasses.is_dataclass(target):
                raise ConfigError(f"titan.{path}", f"'{'.'.join(parts[:depth])}' is not a config section, so it has no field '{part}'.")
            names = _field_names(target)
            if part not in names:
                close = difflib.get_close_matches(part, names, n=3, cutoff=0.5)
                hint = f"did you mean {', '.join(close)}?" if close else f"fields here: {', '.join(names)}."
                where = type(target).__qualname__
                raise ConfigError(f"titan.{path}", f"torchtitan's {where} has no field '{part}'; {hint}")
            if depth == len(parts) - 1:
                current = getattr(target, part)
                if dataclasses.is_dataclass(current) and not dataclasses.is_dataclass(value):
                    raise ConfigError(
                        f"titan.{path}", f"is a config section ({type(current).__qualname__}); set one of its fields instead."
                    )
                setattr(target, part, value)
            else:
                target = getattr(target, part)
        applied.append(path)
    return applied
