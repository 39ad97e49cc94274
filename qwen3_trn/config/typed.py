"""A composed (or saved) config as the typed ``RunConfig``.

Re-merging onto the schema refuses ``+key=`` overrides the schema lacks (Hydra lets them through),
types each per-option group by its ``name``, and checks every range (``ranges``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

from qwen3_trn.common.errors import ConfigError
from qwen3_trn.config.composition import describe_value_problem
from qwen3_trn.config.keys import hint_of
from qwen3_trn.config.ranges import check_ranges as check_key_ranges
from qwen3_trn.config.schema import RunConfig, option_groups


def run_config_from_container(plain: dict[str, Any], check_ranges: bool = True) -> RunConfig:
    base = OmegaConf.structured(RunConfig)
    for group, group_config in option_groups().items():
        node = plain.get(group) or {}
        name, options = node.get("name", base[group].name), group_config.registered()
        if name not in options:
            raise ConfigError(f"{group}.name", f"unknown {group} '{name}'; use one of {', '.join(options)} ({group}=<option>).")
        base[group] = OmegaConf.structured(options[name])
    try:
        typed = OmegaConf.to_object(OmegaConf.merge(base, plain))
    except MissingMandatoryValue as exc:
        key = exc.full_key or "config"
        hint = hint_of(exc.object_type, exc.key) if dataclasses.is_dataclass(exc.object_type) and exc.key else None
        raise ConfigError(key, f"has no value; {hint or 'set it'}.") from None
    except OmegaConfBaseException as exc:
        raise describe_value_problem(exc) from None
    if typed.output_dir is None:
        raise ConfigError("output_dir", "has no value; Hydra sets it from hydra.run.dir in a run, elsewhere give output_dir=<dir>.")
    if check_ranges:
        check_key_ranges(typed)
    return typed


def to_run_config(cfg: DictConfig, check_ranges: bool = True) -> RunConfig:
    try:
        plain = OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as exc:  # e.g. ${oc.env:NAME} of a variable that is not set
        raise ConfigError(
            getattr(exc, "full_key", None) or "config", f"{str(exc).splitlines()[0]}; set what it refers to or give the value."
        ) from None
    return run_config_from_container(plain, check_ranges)
