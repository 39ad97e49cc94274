"""Backends in torchtitan's configurable style: each ``backend=<option>`` composes to its
option's Config, whose ``build()`` makes that mode's Backend class with the composed values."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hydra.errors import ConfigCompositionException

from qwen3_trn.backends import Backend, build_backend
from qwen3_trn.backends.hf_v5 import HfV5Backend
from qwen3_trn.backends.native import NativeBackend
from qwen3_trn.backends.nki_moe import NkiMoeBackend
from qwen3_trn.common.errors import ConfigError
from qwen3_trn.config.schema import BackendConfig
from qwen3_trn.config.store import register_schema
from qwen3_trn.config.typed import to_run_config
from qwen3_trn.results.records import read_summary
from tests.commands import command_in_process
from tests.conftest import compose_config

CASES = [
    (["backend=native"], NativeBackend, {}),
    (["backend=hf_v5", "backend.hf_experts_implementation=eager"], HfV5Backend, {"hf_experts_implementation": "eager"}),
    (["backend=nki_moe", "model=tiny_moe", "backend.kernels=portable"], NkiMoeBackend, {"kernels": "portable"}),
]


@pytest.mark.parametrize("overrides,cls,values", CASES, ids=[c[1].__name__ for c in CASES])
def test_the_composed_option_builds_its_backend(overrides, cls, values, tmp_path):
    cfg = to_run_config(compose_config(overrides, tmp_path / "run"))
    assert type(cfg.backend) is cls.Config
    backend = build_backend(cfg.backend)
    assert type(backend) is cls and backend.config is cfg.backend
    for key, value in values.items():
        assert getattr(backend.config, key) == value


def test_the_registry_is_keyed_by_each_option_name():
    options = BackendConfig.options
    assert {name: config().name for name, config in options.items()} == {name: name for name in options}
    assert {name: config._owner for name, config in options.items()} == {
        "native": NativeBackend,
        "hf_v5": HfV5Backend,
        "nki_moe": NkiMoeBackend,
    }
    nki_moe = build_backend(options["nki_moe"]())
    assert type(nki_moe) is NkiMoeBackend and nki_moe.config.kernels == "auto"
    with pytest.raises(ConfigError) as info:
        build_backend(BackendConfig(name="bogus"))
    assert info.value.key == "backend.name" and "native" in str(info.value)


def test_a_config_no_backend_class_owns_cannot_build():
    with pytest.raises(RuntimeError, match="no backend builds BackendConfig"):
        BackendConfig().build()


def test_a_new_backend_is_its_class_and_its_yaml_option(tmp_path):
    """A backend defined anywhere registers itself: once the schemas are stored, its YAML option
    composes (refusing a key it lacks) and the composed config builds it; nothing lists it."""

    class LoudBackend(NativeBackend):
        @dataclass
        class Config(BackendConfig):
            name: str = "loud_test"
            loudness: int = 3

    try:
        register_schema()
        option = tmp_path / "conf" / "backend" / "loud_test.yaml"
        option.parent.mkdir(parents=True)
        option.write_text("defaults:\n  - /schema/backend@_here_: loud_test\n  - _self_\n")
        searchpath = f"hydra.searchpath=[file://{tmp_path / 'conf'}]"
        cfg = to_run_config(compose_config([searchpath, "backend=loud_test", "backend.loudness=5"], tmp_path / "run"))
        backend = build_backend(cfg.backend)
        assert type(backend) is LoudBackend and backend.config.loudness == 5
        with pytest.raises(ConfigCompositionException):
            compose_config([searchpath, "backend=loud_test", "backend.kernels=auto"], tmp_path / "run")
    finally:
        del BackendConfig.options["loud_test"]


@pytest.mark.parametrize("mode", ["plan", "train"])
def test_a_run_builds_its_backend_once(mode, monkeypatch, tmp_path):
    """Preflight builds the run's backend and hands that one object on: to the conversion, the
    plan, the fit check, the in-process rank (its per-process setup) and its metrics."""
    built: list[Backend] = []
    make = Backend.__init__

    def counted(self: Backend, config: BackendConfig) -> None:
        built.append(self)
        make(self, config)

    monkeypatch.setattr(Backend, "__init__", counted)
    run_dir = tmp_path / "run"
    done = command_in_process(["backend=nki_moe", "model=tiny_moe", "debug=smoke", "training.steps=2", f"mode={mode}"], run_dir)
    assert done.returncode == 0, done.stderr[-3000:]
    assert [type(backend) for backend in built] == [NkiMoeBackend]
    if mode == "train":  # the metrics rank asked that backend what its expert shards ran
        assert read_summary(run_dir)["kernel"]
