"""Every option of every config group composes, validates and converts to a Trainer.Config."""

from __future__ import annotations

import json

import pytest
from torchtitan.trainer import Trainer

from qwen3_trn.app import to_run_config
from qwen3_trn.preflight import prepare
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
