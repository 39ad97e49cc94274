"""A composed (or saved) config as the typed ``RunConfig``.

Re-merging onto the schema refuses keys added with ``+`` that the schema lacks (Hydra lets
``+key=`` through a structured config), and a group with a schema per option is typed by the
option its discriminating key names (``backend.name``, ``launcher.name``).
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, MissingMandatoryValue, OmegaConfBaseException, ValidationError

from qwen3_trn.config.schema import OPTION_SCHEMAS, RunConfig
from qwen3_trn.errors import ConfigError

FIX = (
    "Remove it or check the spelling (python -m qwen3_trn --cfg job lists every key); "
    "torchtitan fields without a key here go under +titan.<path>=<value>."
)


def run_config_from_container(plain: dict[str, Any]) -> RunConfig:
    base = OmegaConf.structured(RunConfig)
    for group, (key, options) in OPTION_SCHEMAS.items():
        node = plain.get(group) or {}
        name = node.get(key, getattr(base[group], key))
        if name not in options:
            raise ConfigError(f"{group}.{key}", f"unknown {group} '{name}'; use one of {', '.join(options)} ({group}=<option>).")
        base[group] = OmegaConf.structured(options[name])
    try:
        merged = OmegaConf.merge(base, plain)
    except (ConfigKeyError, ValidationError) as exc:
        key = getattr(exc, "full_key", None) or "config"
        raise ConfigError(key, f"{str(exc).splitlines()[0]}. {FIX}") from None
    except OmegaConfBaseException as exc:
        raise ConfigError(getattr(exc, "full_key", None) or "config", str(exc).splitlines()[0]) from None
    try:
        return OmegaConf.to_object(merged)
    except MissingMandatoryValue as exc:
        raise ConfigError(exc.full_key or "config", "has no value; set it (e.g. model=<preset> chooses model.flavor).") from None


def to_run_config(cfg: DictConfig) -> RunConfig:
    return run_config_from_container(OmegaConf.to_container(cfg, resolve=True))
