"""Bad input: one clear paragraph naming the key and the fix, exit status 2, before any
worker starts, with nothing written over."""

from __future__ import annotations

import dataclasses
import gzip
import secrets
import sys
import types
import typing

import pytest

from qwen3_trn.app import execute, to_run_config
from qwen3_trn.common.errors import ConfigError
from qwen3_trn.config.ranges import all_ranges
from qwen3_trn.config.store import SWEEPER_SCHEMAS
from tests.commands import command_in_process, command_in_subprocess
from tests.conftest import command_in_process, compose_config


@pytest.mark.parametrize(
    "overrides,key,fix",
    [
        (["launcher.nproc_per_node=2", "parallelism.dp_shard=3"], "parallelism", "world size is 2"),
        (["launcher.nproc_per_node=2", "parallelism.tp=3"], "parallelism.dp_shard", "does not divide the world size"),
        (["training.seq_len=8192"], "training.seq_len", "max_seq_len 4096"),
        (["model=tiny_moe", "model.top_k=16"], "model.top_k", "model.top_k <= 8"),
        (["model.n_heads=4", "model.n_kv_heads=3"], "model.n_heads", "multiple of n_kv_heads"),
        (["launcher.nproc_per_node=4096"], "launcher.nproc_per_node", "launcher.nproc_per_node<="),
        (["device=cuda"], "device", "device=auto"),
        (["device=neuron"], "device", "torch-neuronx"),
        (["data=files", "data.path=/nonexistent/data.jsonl"], "data.path", "does not exist"),
        (["model.hf_assets_path=/tmp"], "model.hf_assets_path", "no tokenizer"),
        (["+titan.training.stepz=3"], "titan.training.stepz", "did you mean steps"),
        (["compile=neuron"], "compile.backend", "compile=inductor"),
        (["validation.interval=0"], "validation.interval", "validation=off"),
        (["data=files", "data.path=qwen3_trn/data/assets/corpus.jsonl.gz", "data.val_fraction=0"], "data.val_fraction", "data.val_path"),
    ],
)
def test_config_errors_name_key_and_fix(overrides, key, fix, tmp_path):
    run_dir = tmp_path / "run"
    with pytest.raises(ConfigError) as info:
        execute(compose_config(overrides, run_dir))
    assert info.value.key == key
    assert fix in str(info.value)
    assert not run_dir.exists(), "nothing may be written before the config is valid"


def test_a_placeholder_torch_neuronx_is_named_as_one(tmp_path, monkeypatch):
    """PyPI's torch-neuronx imports but is empty: it registers no ``torch.neuron``."""
    monkeypatch.setitem(sys.modules, "torch_neuronx", types.ModuleType("torch_neuronx"))
    with pytest.raises(ConfigError) as info:
        execute(compose_config(["device=neuron"], tmp_path / "run"))
    assert info.value.key == "device"
    assert "registered no 'neuron' device" in str(info.value) and "Neuron SDK" in str(info.value)


def test_unknown_key_added_with_plus_is_refused(tmp_path):
    with pytest.raises(ConfigError) as info:
        to_run_config(compose_config(["+model.n_layerz=2"], tmp_path))
    assert info.value.key == "model.n_layerz"


def _bad_yaml_in_config_dir(tmp_path):
    (tmp_path / "conf" / "optimizer").mkdir(parents=True)
    (tmp_path / "conf" / "optimizer" / "mine.yaml").write_text("lr: [1,\n")
    return ["--config-dir", str(tmp_path / "conf"), "optimizer=mine"]


def _config_dir_shadowing_the_packaged_config(tmp_path):
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "config.yaml").write_text("training:\n  steps: [1, 2\n")
    return ["--config-dir", str(tmp_path / "conf")]


def _binary_data_file(tmp_path):
    (tmp_path / "blob.jsonl.gz").write_bytes(gzip.compress(bytes(range(256)) * 16))
    return ["data=files", f"data.path={tmp_path / 'blob.jsonl.gz'}"]


# One command line for each kind of bad input: Hydra's composition, a project check, the config
# files, the data, the override syntax. The first runs as a real ``python -m qwen3_trn`` process,
# the others through the same entry point in this process (``command_in_process``).
CLI_CASES = [
    (["model=nonexistent"], "error: model: "),
    (["model=tiny_moe", "model.top_k=16"], "model.top_k"),
    (_bad_yaml_in_config_dir, "mine.yaml, line 2, column 1: malformed YAML"),
    (_config_dir_shadowing_the_packaged_config, "has the name of the packaged conf/config.yaml"),
    (_binary_data_file, "blob.jsonl.gz is not text"),
    (["training.seq_len=[32"], "training.seq_len: cannot parse the override"),
    (["model.n_layerz=2"], "model.n_layerz"),
    (["training.steps=many"], "training.steps"),
    (["+training.foo=1"], "training.foo"),
    (["optimizer.beta2=1.5"], "optimizer.beta2: must be < 1"),
]


@pytest.mark.parametrize("args,needle", CLI_CASES)
def test_cli_reports_errors_without_traceback(args, needle, tmp_path):
    """Exit status 2 from ``python -m qwen3_trn`` for Hydra's composition errors and the
    project's own checks alike; the run directory Hydra creates first is removed again."""
    run = command_in_subprocess if args is CLI_CASES[0][0] else command_in_process
    args = args(tmp_path) if callable(args) else args
    run_dir = tmp_path / "runs" / "run"
    result = run(args, run_dir)
    assert result.returncode == 2, result.stderr[-3000:]
    assert needle in result.stderr
    assert "Traceback" not in result.stderr
    assert not run_dir.exists()


def test_existing_run_directory_is_never_overwritten(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n')
    with pytest.raises(ConfigError) as info:
        execute(compose_config([], run_dir))
    assert info.value.key == "hydra.run.dir"
    assert (run_dir / "metrics.jsonl").read_text() == '{"step": 1, "loss": 1.0}\n'
    assert not (run_dir / "config.yaml").exists()


@pytest.mark.parametrize(
    "args,named",
    [
        (["hparams_search=tiny_lr", "hydra.sweeper.n_trials=0"], ["hydra.sweeper.n_trials: must be >= 1, got 0"]),
        (["hparams_search=tiny_lr", "hydra.sweeper.n_concurrent=0"], ["hydra.sweeper.n_concurrent: must be >= 1, got 0"]),
        (
            ["-m", "training.seed=1,2", "hydra.sweeper.max_batch_size=0", "training.steps=0"],
            ["hydra.sweeper.max_batch_size: must be >= 1, got 0; valid: >= 1."],
        ),
    ],
    ids=["search-trials", "search-concurrent", "sweep-batch-size"],
)
def test_the_sweepers_counts_and_sizes_are_ranged(args, named, tmp_path):
    """The sweepers' own keys (their schemas: ``config.store``) are ranged like a run's: exit 2
    naming the key before the sweep directory, a study or a job is created."""
    sweep_dir = tmp_path / "sweep"
    result = command_in_process([*args, f"hydra.sweep.dir={sweep_dir}"])
    assert result.returncode == 2, result.stderr[-3000:]
    for needle in named:
        assert needle in result.stderr and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert not sweep_dir.exists()


def test_a_study_storage_password_is_never_printed_nor_written(tmp_path):
    """A database URL Hydra cannot parse (unquoted ``=``), and one whose server is not there: exit
    2 naming hydra.sweeper.storage, the password redacted from what is printed and written."""
    password = f"pw-{secrets.token_hex(8)}"
    url = f"mysql+pymysql://optuna:{password}@127.0.0.1:1/optuna"
    unquoted = command_in_process(
        ["hparams_search=tiny_lr", f"hydra.sweeper.storage={url}?charset=utf8", f"hydra.sweep.dir={tmp_path / 'a'}"]
    )
    unreachable = command_in_process(["hparams_search=tiny_lr", f"hydra.sweeper.storage='{url}'", f"hydra.sweep.dir={tmp_path / 'b'}"])
    for result in (unquoted, unreachable):
        assert result.returncode == 2 and "hydra.sweeper.storage" in result.stderr, result.stderr[-3000:]
        assert password not in result.stdout + result.stderr, result.stderr[-3000:]
    assert "hydra.sweeper.storage=mysql+pymysql://optuna:<redacted>@127.0.0.1:1/optuna?charset=utf8" in unquoted.stderr
    assert "cannot open the study's storage mysql+pymysql://optuna@127.0.0.1:1/optuna: " in unreachable.stderr
    assert not [path for path in tmp_path.rglob("*") if path.is_file() and password.encode() in path.read_bytes()]


def test_every_count_of_the_sweepers_has_a_range():
    for schema in SWEEPER_SCHEMAS.values():
        counts = {f.name for f in dataclasses.fields(schema) if typing.get_type_hints(schema)[f.name] in (int, typing.Optional[int])}
        assert counts and counts <= set(all_ranges(schema)), schema
