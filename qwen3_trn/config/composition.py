"""Hydra's and OmegaConf's composition errors as one clear ``ConfigError``.

A malformed YAML file, an unknown key, a value of the wrong type or an option that does not
exist, whether in ``conf/``, in a ``--config-dir`` file or on the command line, becomes a
``ConfigError`` naming the key, where it was given (the file with line and column, or the
override) and the fix, instead of Hydra's report and exit status 1.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import typing
from pathlib import Path
from typing import Any, Iterable

import yaml
from hydra.errors import MissingConfigException, OverrideParseException
from omegaconf.errors import OmegaConfBaseException

from qwen3_trn.config.files import describe_yaml_error, yaml_position
from qwen3_trn.config.schema import OPTION_SCHEMAS, RunConfig
from qwen3_trn.errors import ConfigError

KEYS_HINT = "python -m qwen3_trn --cfg job lists every key"

_TYPE_WORDS = {
    "Integer": ("an integer", "give a whole number"),
    "Float": ("a number", "give a number such as 3e-4"),
    "Boolean": ("true or false", "give true or false"),
}


def _schema_classes(parts: list[str]) -> list[type]:
    """The dataclasses that can sit at the key path ``parts`` (every option's schema of a group)."""
    classes: list[type] = [RunConfig]
    for depth, part in enumerate(parts):
        found: list[type] = []
        for cls in classes:
            hints = typing.get_type_hints(cls)
            if part not in hints:
                continue
            if depth == 0 and part in OPTION_SCHEMAS:
                found.extend(OPTION_SCHEMAS[part][1].values())
            elif dataclasses.is_dataclass(hints[part]):
                found.append(hints[part])
        classes = found
    return classes


def _field_names(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def _unknown_key_fix(key: str) -> str:
    parts = key.split(".")
    parent, name = parts[:-1], parts[-1]
    classes = _schema_classes(parent)
    if not classes:
        return f"remove it or fix the spelling ({KEYS_HINT})."
    group = parent[0] if parent else None
    if group in OPTION_SCHEMAS:
        owners = [option for option, cls in OPTION_SCHEMAS[group][1].items() if name in _field_names(cls)]
        if owners:
            return f"it belongs to {' / '.join(f'{group}={o}' for o in owners)}; choose that option or remove the key."
    names = sorted({n for cls in classes for n in _field_names(cls)})
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    where = ".".join(parent) or "the top level"
    return (
        f"{hint}Keys of {where}: {', '.join(names)}. Remove it or fix the spelling; torchtitan fields without a key "
        "here go under +titan.<path>=<value>."
    )


def _default_hint(key: str) -> str:
    node: Any = RunConfig(output_dir="")
    for part in key.split("."):
        node = getattr(node, part, None)
        if node is None:
            return ""
    return f" (the default is {node})" if not dataclasses.is_dataclass(node) else ""


def describe_value_problem(key: str, message: str, where: str = "") -> ConfigError:
    """A ConfigError for OmegaConf's message about ``key`` (its first line, without the
    ``full_key`` block), said in the user's terms."""
    first = message.strip().splitlines()[0] if message.strip() else message
    at = f" ({where})" if where else ""
    if m := re.match(r"Value '(.*)' of type '(\w+)' could not be converted to (\w+)", first):
        what, fix = _TYPE_WORDS.get(m.group(3), (m.group(3).lower(), f"give a {m.group(3).lower()}"))
        return ConfigError(key, f"'{m.group(1)}' is not {what}{at}; {fix}{_default_hint(key)}.")
    if m := re.match(r"Value '(.*)' is not a valid bool", first):
        return ConfigError(key, f"'{m.group(1)}' is not true or false{at}; give true or false{_default_hint(key)}.")
    if m := re.match(r"Invalid value '(.*)', expected one of \[(.*)\]", first):
        return ConfigError(key, f"'{m.group(1)}' is not an option{at}; use one of {m.group(2)}.")
    if m := re.match(r"Cannot convert '(\w+)' to string", first):
        return ConfigError(key, f"expects a string, got a {m.group(1)}{at}; give a plain value (quote it if it has commas or brackets).")
    if m := re.match(r"Cannot assign (\w+) to (Dict\[.*\])", first):
        return ConfigError(
            key, f"expects a mapping, got {m.group(1)}{at}; give {{NAME: value, ...}} or set single entries with +{key}.NAME=value."
        )
    if m := re.match(r"Invalid value assigned: (\w+) is not a ListConfig", first):
        return ConfigError(key, f"expects a list, got {m.group(1)}{at}; give [a, b, ...].")
    if re.match(r"Key '.*' (not in|is not in struct)", first):
        return ConfigError(key, f"no such key{at}; {_unknown_key_fix(key)}")
    return ConfigError(key, f"{first}{at}.")


def _clean_key(key: str) -> str:
    return re.sub(r"\[\d+\]$", "", key)


def refuse_shadowed_config_files(config_dirs: Iterable[Path], packaged: Path) -> None:
    """Hydra searches the packaged ``conf/`` before a ``--config-dir``, so a file there with the
    name of a packaged one (``config.yaml``, ``model/tiny.yaml``) would never be read: refuse it
    rather than train without the user's file."""
    for config_dir in config_dirs:
        if not config_dir.is_dir() or config_dir.resolve() == packaged.resolve():
            continue
        for path in sorted(config_dir.rglob("*.yaml")):
            relative = path.relative_to(config_dir)
            if not (packaged / relative).is_file():
                continue
            group = relative.parent.as_posix()
            if group == ".":
                fix = (
                    "name it differently and pick it with --config-name=<that name>, or make it an "
                    "experiment/<name>.yaml and pick it with experiment=<name>"
                )
            else:
                fix = f"give it another name and pick it with {group}=<that name>"
            raise ConfigError(
                "--config-dir",
                f"{path} has the name of the packaged conf/{relative.as_posix()}, which Hydra reads first, "
                f"so this file would never be used; {fix}.",
            )


def _locate(config_name: str, search_dirs: Iterable[Path]) -> Path | None:
    for directory in search_dirs:
        candidate = Path(directory) / f"{config_name}.yaml"
        if candidate.is_file():
            return candidate
    return None


def _file_position(path: Path, key: str) -> str:
    parts = key.split(".")
    for start in range(len(parts)):
        position = yaml_position(path, parts[start:])
        if position:
            return f"in {path}, line {position[0]}, column {position[1]}"
    return f"in {path}"


def _cause_chain(exc: BaseException) -> Iterable[BaseException]:
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def composition_error(exc: BaseException, search_dirs: Iterable[Path] = ()) -> ConfigError:
    """The ConfigError that says what went wrong composing the config, and where."""
    search_dirs = list(search_dirs)
    if isinstance(exc, ConfigError):
        return exc
    for link in _cause_chain(exc):
        if isinstance(link, yaml.YAMLError):
            mark = getattr(link, "problem_mark", None) or getattr(link, "context_mark", None)
            group = _group_of(Path(mark.name), search_dirs) if mark is not None and mark.name else "config"
            return ConfigError(group, f"{describe_yaml_error(link)}; fix the YAML syntax there.")
    text = str(exc)
    if isinstance(exc, OverrideParseException):
        key = exc.override.split("=", 1)[0].lstrip("+~") or exc.override
        return ConfigError(
            key,
            f"cannot parse the override '{exc.override}' ({exc.message.splitlines()[0]}); "
            "see https://hydra.cc/docs/advanced/override_grammar/basic (quote values with special characters).",
        )
    if isinstance(exc, MissingConfigException) or "Could not find '" in text:
        return _missing_option(text)
    if m := re.search(r"Ambiguous value for argument '([^=']+)=([^']*)'", text):
        return ConfigError(
            m.group(1),
            f"'{m.group(2)}' is ambiguous: for a list write {m.group(1)}=[{m.group(2)}], for a string quote it "
            f"({m.group(1)}='{m.group(2)}'), to sweep over it add -m.",
        )
    if m := re.search(r"An item is already at '([^']+)'", text):
        return ConfigError(
            m.group(1), f"already exists, so it cannot be added with '+'; write {m.group(1)}=<value> (or ++ to add or override)."
        )
    if m := re.match(r"In '([^']+)': (\w+) raised while composing config:\n(.*)", text, re.S):
        config_name, body = m.group(1), m.group(3)
        key = _clean_key(_full_key(body) or config_name.split("/")[0])
        path = _locate(config_name, search_dirs)
        where = _file_position(path, key) if path else f"in config '{config_name}'"
        return describe_value_problem(key, body, where)
    cause = next((link for link in _cause_chain(exc) if isinstance(link, OmegaConfBaseException) and getattr(link, "full_key", None)), None)
    if cause is not None:
        override = re.search(r"(?:Error merging override|Could not override '?)\s*'?([^\s']+)", text)
        where = f"command line: {override.group(1)}" if override else ""
        return describe_value_problem(_clean_key(cause.full_key), str(cause), where)
    if isinstance(exc, OmegaConfBaseException) and getattr(exc, "full_key", None):
        return describe_value_problem(_clean_key(exc.full_key), text)
    return ConfigError("config", f"{text.strip().splitlines()[0] if text.strip() else type(exc).__name__}; {KEYS_HINT}.")


def _full_key(body: str) -> str | None:
    m = re.search(r"full_key: (\S+)", body)
    return m.group(1) if m else None


def _group_of(path: Path, search_dirs: list[Path]) -> str:
    """``optimizer`` for ``<config dir>/optimizer/mine.yaml`` (``config`` for the primary file)."""
    for directory in search_dirs:
        try:
            relative = path.resolve().relative_to(Path(directory).resolve())
        except ValueError:
            continue
        return relative.parent.as_posix() if relative.parent.as_posix() != "." else relative.stem
    return path.parent.name or "config"


def _missing_option(text: str) -> ConfigError:
    m = re.search(r"Could not find '([^']+)/([^'/]+)'", text)
    options = re.search(r"Available options in '([^']+)':\n((?:\t.*\n?)*)", text)
    if m:
        group, option = m.group(1), m.group(2)
        listed = ", ".join(line.strip() for line in options.group(2).splitlines() if line.strip()) if options else ""
        shown = f"Available options in '{group}': {listed}" if listed else f"the group '{group}' has no options on the config search path"
        return ConfigError(group, f"no option '{option}'. {shown}; add a {group}/{option}.yaml with --config-dir, or pick one of those.")
    m = re.search(r"Could not find '([^']+)'", text)
    name = m.group(1) if m else "config"
    return ConfigError(name.split("/")[0], f"no config '{name}' on the config search path; check --config-dir / --config-name.")
