"""Hydra's and OmegaConf's composition errors as one ``ConfigError``: the library's first line,
the key, where it was given (file, line and column, or the override) and the fix.

Nothing here parses the libraries' wording: the key, value and type come from the exceptions'
attributes, and the input being composed from the Hydra object on the failing call stack.
"""

from __future__ import annotations

import dataclasses
import difflib
import traceback
import types
import typing
from enum import Enum
from pathlib import Path
from typing import Any, Iterable

import yaml
from hydra.core.default_element import ResultDefault
from hydra.core.override_parser.types import Override
from hydra.errors import MissingConfigException, OverrideParseException
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException, ValidationError

from qwen3_trn.common.errors import ConfigError, first_line
from qwen3_trn.config.files import describe_yaml_error, yaml_position

KEYS_HINT = "python -m qwen3_trn --cfg job lists every key"
OVERRIDE_GRAMMAR = "https://hydra.cc/docs/advanced/override_grammar/basic"

# What to give for a value of the declared type.
_TYPE_FIXES = {
    bool: "give true or false",
    int: "give a whole number",
    float: "give a number such as 3e-4",
    str: "give a plain value (quote it if it has commas or brackets)",
}


def _field(cls: Any, name: str) -> dataclasses.Field | None:
    if not dataclasses.is_dataclass(cls):
        return None
    return next((f for f in dataclasses.fields(cls) if f.name == name), None)


def _option_name(cls: type) -> str | None:
    """The option name a schema class registers (the default of its ``name``), or None."""
    field = _field(cls, "name")
    name = field.default if field is not None and isinstance(field.default, str) else None
    return name if getattr(cls, "options", {}).get(name) is cls else None


def _sibling_schemas(exc: OmegaConfBaseException) -> list[type]:
    """Every schema the key's parent could have: for a group with a schema per option, each
    option's (subclasses of OmegaConf's ``ref_type``)."""
    found, todo = [], [exc.ref_type] if dataclasses.is_dataclass(exc.ref_type) else []
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return [cls for cls in found if cls is not exc.object_type]


def _unknown_key_fix(exc: OmegaConfBaseException) -> str:
    parent, _, name = _clean_key(exc.full_key or str(exc.key)).rpartition(".")
    if not dataclasses.is_dataclass(exc.object_type):
        return f"remove it or fix the spelling ({KEYS_HINT})."
    owners = [option for cls in _sibling_schemas(exc) if _field(cls, name) and (option := _option_name(cls))]
    if owners:
        return f"it belongs to {' / '.join(f'{parent}={option}' for option in owners)}; choose that option or remove the key."
    names = sorted(f.name for f in dataclasses.fields(exc.object_type))
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    return (
        f"{hint}Keys of {parent or 'the top level'}: {', '.join(names)}. Remove it or fix the spelling; torchtitan fields "
        "without a key here go under +titan.<path>=<value>."
    )


def _default_hint(exc: OmegaConfBaseException) -> str:
    field = _field(exc.object_type, str(exc.key))
    if field is None or field.default in (dataclasses.MISSING, None, "???"):
        return ""
    return f" (the default is {field.default})"


def _declared_type(exc: OmegaConfBaseException) -> Any:
    """The schema's type of the key ``exc`` is about (``Optional[X]`` as ``X``), or None."""
    if _field(exc.object_type, str(exc.key)) is None:
        return None
    try:
        declared = typing.get_type_hints(exc.object_type).get(str(exc.key))
    except (NameError, TypeError):
        return None
    if typing.get_origin(declared) in (typing.Union, types.UnionType):
        given = [arg for arg in typing.get_args(declared) if arg is not type(None)]
        declared = given[0] if len(given) == 1 else None
    return declared


def _type_fix(exc: OmegaConfBaseException) -> str:
    """How to give a value of the key's declared type."""
    declared = _declared_type(exc)
    container = typing.get_origin(declared) or declared
    if isinstance(declared, type) and issubclass(declared, Enum):
        return f"use one of {', '.join(declared.__members__)}"
    if declared in _TYPE_FIXES:
        return _TYPE_FIXES[declared] + _default_hint(exc)
    if container in (dict, typing.Mapping):
        return f"give {{NAME: value, ...}} or set single entries with +{_clean_key(exc.full_key or str(exc.key))}.NAME=value"
    if container in (list, tuple):
        return "give [a, b, ...]"
    return f"give a value of the type the key takes ({KEYS_HINT})"


def _clean_key(key: str) -> str:
    """``a.b`` for the list item ``a.b[2]``."""
    return key[: key.rindex("[")] if key.endswith("]") and "[" in key else key


def describe_value_problem(exc: OmegaConfBaseException, where: str = "") -> ConfigError:
    """A ConfigError for OmegaConf's error about a key (an unknown key, a value of the wrong type):
    its message, the key, where it was given and the fix."""
    key = _clean_key(exc.full_key or "config")
    said = f"{first_line(exc)}{f' ({where})' if where else ''}"
    if isinstance(exc, (ConfigKeyError, ConfigAttributeError)):
        return ConfigError(key, f"{said}; no such key: {_unknown_key_fix(exc)}")
    if isinstance(exc, ValidationError):
        return ConfigError(key, f"{said}; {_type_fix(exc)}.")
    return ConfigError(key, f"{said}; {KEYS_HINT}.")


def refuse_shadowed_config_files(config_dirs: Iterable[Path], packaged: Path) -> None:
    """Refuse a ``--config-dir`` file named like a packaged one (``config.yaml``,
    ``model/tiny.yaml``): Hydra searches the packaged ``conf/`` first, so it would never be read."""
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


def _locate(config_path: str, search_dirs: Iterable[Path]) -> Path | None:
    for directory in search_dirs:
        candidate = Path(directory) / f"{config_path}.yaml"
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


def _failing_input(exc: BaseException) -> Override | ResultDefault | None:
    """The innermost command-line ``Override`` or config file (``ResultDefault``) held by a frame of
    ``exc``'s call stack."""
    for link in _cause_chain(exc):
        for frame, _ in reversed(list(traceback.walk_tb(link.__traceback__))):
            found = next((v for v in frame.f_locals.values() if isinstance(v, (Override, ResultDefault))), None)
            if found is not None:
                return found
    return None


def failing_override(exc: BaseException) -> str | None:
    """The command-line override Hydra was applying when ``exc`` was raised, as given."""
    given = _failing_input(exc)
    return given.input_line if isinstance(given, Override) else None


def _where(given: Override | ResultDefault | None, key: str, search_dirs: list[Path]) -> str:
    if isinstance(given, Override):
        return f"command line: {given.input_line}"
    if isinstance(given, ResultDefault) and given.config_path:
        path = _locate(given.config_path, search_dirs)
        return _file_position(path, key) if path else f"in config '{given.config_path}'"
    return ""


def _override_problem(exc: BaseException, override: Override) -> ConfigError:
    """A problem of the override itself (no key of the config at fault yet)."""
    key, value = override.key_or_group, str(override.input_line).partition("=")[2]
    if override.is_sweep_override():
        fix = f"for a list write {key}=[{value}], for a string quote it ({key}='{value}'), to sweep over it add -m"
    elif override.is_add():
        fix = f"{key} already exists, so it cannot be added with '+'; write {key}=<value> (or ++{key}=<value> to add or override)"
    else:
        fix = f"see {OVERRIDE_GRAMMAR}"
    return ConfigError(key, f"{first_line(exc)}; {fix}.")


def _missing_option(exc: MissingConfigException) -> ConfigError:
    missing = exc.missing_cfg_file or "config"
    group, _, option = missing.rpartition("/")
    if not group:
        return ConfigError(missing, f"{first_line(exc)}; check --config-dir / --config-name.")
    if exc.options:
        options = f"the options of {group} are {', '.join(exc.options)}: pick one"
    else:
        options = f"the group {group} has no options on the config search path"
    return ConfigError(group, f"{first_line(exc)}; {options}, or add a {group}/{option}.yaml with --config-dir.")


def _unparsable(exc: OverrideParseException) -> ConfigError:
    key = exc.override.split("=", 1)[0].lstrip("+~") or exc.override
    return ConfigError(
        key,
        f"cannot parse the override '{exc.override}' ({first_line(Exception(exc.message))}); "
        f"see {OVERRIDE_GRAMMAR} (quote values with special characters).",
    )


def composition_error(exc: BaseException, search_dirs: Iterable[Path] = ()) -> ConfigError:
    """The ConfigError that says what went wrong composing the config, and where."""
    search_dirs = list(search_dirs)
    chain = list(_cause_chain(exc))
    for link in chain:
        if isinstance(link, ConfigError):  # also one Hydra wrapped (a callback's import raised it)
            return link
        if isinstance(link, yaml.YAMLError):
            mark = getattr(link, "problem_mark", None) or getattr(link, "context_mark", None)
            group = _group_of(Path(mark.name), search_dirs) if mark is not None and mark.name else "config"
            return ConfigError(group, f"{describe_yaml_error(link)}; fix the YAML syntax there.")
        if isinstance(link, OverrideParseException):
            return _unparsable(link)
        if isinstance(link, MissingConfigException):
            return _missing_option(link)
    given = _failing_input(exc)
    value_error = next((link for link in chain if isinstance(link, OmegaConfBaseException) and link.full_key), None)
    if value_error is not None:
        return describe_value_problem(value_error, _where(given, _clean_key(value_error.full_key), search_dirs))
    if isinstance(given, Override):
        return _override_problem(exc, given)
    return ConfigError("config", f"{first_line(exc)}; {KEYS_HINT}.")


def _group_of(path: Path, search_dirs: list[Path]) -> str:
    """``optimizer`` for ``<config dir>/optimizer/mine.yaml`` (``config`` for the primary file)."""
    for directory in search_dirs:
        try:
            relative = path.resolve().relative_to(Path(directory).resolve())
        except ValueError:
            continue
        return relative.parent.as_posix() if relative.parent.as_posix() != "." else relative.stem
    return path.parent.name or "config"
