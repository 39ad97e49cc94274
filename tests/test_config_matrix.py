"""Every option of every config group composes, validates and converts to a Trainer.Config."""

from __future__ import annotations

import json
import typing
from enum import Enum

import pytest
from omegaconf import OmegaConf
from torchtitan.trainer import Trainer

from qwen3_trn.app import to_run_config
from qwen3_trn.config.keys import leaves
from qwen3_trn.config.schema import RunConfig
from qwen3_trn.run.preflight import prepare
from tests.conftest import CONF, compose_config

# Options that need a value only the user can give.
EXTRA = {
    ("data", "files"): ["data.path=qwen3_trn/data/assets/corpus.jsonl.gz"],
    ("data", "hub"): ["data.path=roneneldan/TinyStories"],
    ("compile", "neuron"): ["device=neuron"],
}


def _options():
    for group_dir in sorted(p for p in CONF.iterdir() if p.is_dir()):
        for option in sorted(group_dir.glob("*.yaml")):
            yield group_dir.name, option.stem


OPTIONS = list(_options())


def test_every_group_has_options():
    groups = {group for group, _ in OPTIONS}
    assert {
        "backend",
        "model",
        "parallelism",
        "compile",
        "data",
        "training",
        "optimizer",
        "checkpoint",
        "logger",
        "launcher",
        "device",
        "experiment",
    } <= groups


@pytest.mark.parametrize("group,option", OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_option_composes_and_converts(group, option, tmp_path):
    cfg = compose_config([f"{group}={option}", "mode=plan", *EXTRA.get((group, option), [])], tmp_path)
    prepared = prepare(to_run_config(cfg))
    trainer_config = prepared.trainer_config
    assert isinstance(trainer_config, Trainer.Config)
    # The dump every run writes must serialize.
    json.dumps(trainer_config.to_dict(), default=repr)
    assert trainer_config.training.steps == prepared.cfg.training.steps
    if group == "model":
        assert trainer_config.model_spec.flavor == prepared.cfg.model.flavor


def _enum_keys() -> list[tuple[str, str]]:
    """(group, key) of every group whose options are the values of an Enum key: each option that
    sets the key is named after its value (compile=inductor sets compile.backend: inductor)."""
    hints = typing.get_type_hints(RunConfig)
    named, misnamed = set(), set()
    for group, option in OPTIONS:
        schema = hints.get(group)
        if not isinstance(schema, type):
            continue
        keys = typing.get_type_hints(schema)
        chosen = OmegaConf.to_container(OmegaConf.load(CONF / group / f"{option}.yaml")) or {}
        for key, value in chosen.items():
            if isinstance(keys.get(key), type) and issubclass(keys[key], Enum):
                (named if str(value).casefold() == option.casefold() else misnamed).add((group, key))
    return sorted(named - misnamed)


ENUM_KEYS = _enum_keys()


def test_the_groups_choosing_an_enum_value_are_found():
    assert {("compile", "backend"), ("optimizer", "name"), ("device", "type")} <= set(ENUM_KEYS)


@pytest.mark.parametrize("group,key", ENUM_KEYS, ids=[f"{g}.{k}" for g, k in ENUM_KEYS])
def test_every_enum_value_of_a_group_has_an_option(group, key, tmp_path):
    choices = typing.get_type_hints(typing.get_type_hints(RunConfig)[group])[key]
    composed = {}
    for option in (o for g, o in OPTIONS if g == group):
        cfg = to_run_config(compose_config([f"{group}={option}", *EXTRA.get((group, option), [])], tmp_path / option))
        composed[getattr(getattr(cfg, group), key)] = option
    missing = [str(value) for value in choices if value not in composed]
    assert not missing, f"{group}.{key} values without a conf/{group}/<option>.yaml: {missing}"


def _chosen_keys(group: str, option: str) -> set[str]:
    """The dotted keys an option's file sets (``conf/<group>/<option>.yaml``)."""

    def flat(node, prefix):
        for key, value in node.items():
            if isinstance(value, dict):
                yield from flat(value, f"{prefix}{key}.")
            elif key != "defaults":
                yield f"{prefix}{key}"

    return set(flat(OmegaConf.to_container(OmegaConf.load(CONF / group / f"{option}.yaml")) or {}, f"{group}."))


def test_the_schema_defaults_are_what_conf_config_yaml_composes(tmp_path):
    """``RunConfig()`` (the schema's defaults, which a saved config or a test types against) and
    the command with no arguments (``conf/config.yaml``'s default options) agree: the same option
    of each group, the same value of every key but those the default options' files set."""
    defaults = [entry for entry in OmegaConf.to_container(OmegaConf.load(CONF / "config.yaml"))["defaults"] if isinstance(entry, dict)]
    chosen = {group: option for entry in defaults for group, option in entry.items() if option is not None and " " not in group}
    composed = to_run_config(compose_config([], tmp_path), check_ranges=False)
    schema = RunConfig(output_dir=composed.output_dir)
    for group in ("backend", "data", "launcher"):
        assert chosen[group] == getattr(schema, group).name, f"conf/config.yaml chooses {group}={chosen[group]}"
        assert type(getattr(composed, group)) is type(getattr(schema, group))
    set_by_options = set().union(*(_chosen_keys(group, option) for group, option in chosen.items() if (CONF / group).is_dir()))
    values = {key: value for key, _, value in leaves(schema)}
    differ = {key for key, _, value in leaves(composed) if values.get(key) != value}
    assert differ <= set_by_options, (
        f"keys whose schema default conf/config.yaml's options change without setting them: {sorted(differ - set_by_options)}"
    )
    assert {"model.flavor", "logger.backends"} <= differ  # the comparison sees what the options set
