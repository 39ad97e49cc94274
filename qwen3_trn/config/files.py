"""Reading the user's files with errors that name the file, line and column."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from qwen3_trn.common.errors import ConfigError


def read_json_file(path: str | Path, key: str, what: str = "JSON file") -> Any:
    """The parsed content of ``path``; ConfigError(key) if it cannot be read or parsed."""
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise ConfigError(key, f"cannot read {path}: {exc.strerror or exc}; check that the file exists and is readable.") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            key,
            f"{path} is not text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start} is not UTF-8); replace it with the real {what}.",
        ) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            key, f"{path}, line {exc.lineno}, column {exc.colno}: not valid JSON ({exc.msg}); fix or replace this {what}."
        ) from None


def yaml_error_position(exc: yaml.YAMLError) -> tuple[str | None, int | None, int | None]:
    """File name, 1-based line and column of a YAML syntax error (the problem's mark)."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    if mark is None:
        return None, None, None
    return mark.name, mark.line + 1, mark.column + 1


def describe_yaml_error(exc: yaml.YAMLError) -> str:
    """One line: where the YAML is malformed and why."""
    name, line, column = yaml_error_position(exc)
    problem = (
        " ".join(str(part) for part in (getattr(exc, "context", None), getattr(exc, "problem", None)) if part) or str(exc).splitlines()[0]
    )
    where = f"{name}, line {line}, column {column}" if name else "the YAML"
    return f"{where}: malformed YAML ({problem})"


def yaml_position(path: str | Path, dotted: list[str]) -> tuple[int, int] | None:
    """1-based (line, column) of the key path ``dotted`` in a YAML file, or None."""
    if not dotted:
        return None
    try:
        node = yaml.compose(Path(path).read_text())
    except (OSError, yaml.YAMLError):
        return None
    for part in dotted:
        if not isinstance(node, yaml.MappingNode):
            return None
        for key_node, value_node in node.value:
            if key_node.value == part:
                found = key_node
                node = value_node
                break
        else:
            return None
    return found.start_mark.line + 1, found.start_mark.column + 1
