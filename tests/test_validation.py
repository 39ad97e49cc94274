"""Held-out validation: the split of every data source, torchtitan's Validator, and where the
figures go (metrics.jsonl, console, summary.json; wandb and reports in test_sweep.py)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from torchtitan.hf_datasets.text_datasets import DATASETS

from qwen3_trn.app import to_run_config
from qwen3_trn.common.errors import ConfigError
from qwen3_trn.data.embedded import validation_corpus_path
from qwen3_trn.data.sources import held_out_indices, resolve_dataset, resolve_validation_dataset
from qwen3_trn.data.sources.c4 import C4Source
from qwen3_trn.data.sources.embedded import EmbeddedSource
from qwen3_trn.data.sources.files import FilesSource
from qwen3_trn.data.sources.hub import HubSource
from qwen3_trn.results.records import read_summary
from qwen3_trn.run.metrics import JsonlLogger
from qwen3_trn.run.preflight import prepare
from qwen3_trn.run.validation import RunValidator, validator_config
from tests.commands import REPO, cli_env, command_in_process
from tests.conftest import REPO, assert_trained, compose_config

TRAIN = "loss_metrics/global_avg_loss"
VAL = "validation_metrics/loss"


def _texts(resolved) -> list[str]:
    entry = DATASETS[resolved.name]
    dataset = entry.loader(resolved.path)
    return [entry.sample_processor(row) for row in dataset]


@pytest.fixture
def documents(tmp_path) -> Path:
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps({"body": f"document number {i}"}) + "\n" for i in range(10)))
    return path


# --------------------------------------------------------------------------------------------
# The held-out split of each data source
# --------------------------------------------------------------------------------------------


def test_files_hold_out_a_fraction_that_training_never_sees(documents):
    data = FilesSource.Config(path=str(documents), text_column="body", val_fraction=0.2)
    train, held_out = _texts(resolve_dataset(data, seed=0)), _texts(resolve_validation_dataset(data))
    assert held_out == ["document number 2", "document number 7"]  # evenly spaced, in order
    assert len(train) == 8 and not set(train) & set(held_out)
    assert sorted(train + held_out) == sorted(f"document number {i}" for i in range(10))
    # the same documents every time (every rank, every run of a sweep)
    assert _texts(resolve_validation_dataset(data)) == held_out
    assert held_out_indices(1000, 0.01) == [50 + 100 * i for i in range(10)]


def test_files_with_their_own_validation_files(documents, tmp_path):
    held_out = tmp_path / "val.txt"
    held_out.write_text("a held-out line\nanother one\n")
    data = FilesSource.Config(path=str(documents), text_column="body", val_path=str(held_out))
    assert len(_texts(resolve_dataset(data, seed=0))) == 10  # nothing held out of the training files
    assert _texts(resolve_validation_dataset(data)) == ["a held-out line", "another one"]


def test_embedded_and_c4_bring_their_validation_split():
    embedded = resolve_validation_dataset(EmbeddedSource.Config())
    assert embedded.path == str(validation_corpus_path())
    assert len(_texts(embedded)) >= 10 and not set(_texts(embedded)) & set(_texts(resolve_dataset(EmbeddedSource.Config(), seed=0)))
    assert resolve_validation_dataset(C4Source.Config()).name == "c4_validation"


def test_hub_validation_split_is_its_own_split():
    data = HubSource.Config(path="roneneldan/TinyStories", val_split="validation")
    held_out, train = resolve_validation_dataset(data), resolve_dataset(data, seed=0)
    assert DATASETS[held_out.name].loader.args[:2] == (None, "validation")
    source_loader, seed = DATASETS[train.name].loader.args[:2]  # the whole training split, shuffled by the seed
    assert source_loader.args[:2] == (None, "train") and seed == 0


def test_the_seed_orders_the_training_documents_and_not_the_held_out_ones(documents):
    data = FilesSource.Config(path=str(documents), text_column="body", val_fraction=0.2)
    orders = [_texts(resolve_dataset(data, seed=seed)) for seed in (0, 1, 0)]
    assert orders[0] == orders[2] and orders[0] != orders[1]  # the same seed, the same order
    assert sorted(orders[0]) == sorted(orders[1])  # the same documents
    assert _texts(resolve_validation_dataset(data)) == ["document number 2", "document number 7"]


@pytest.mark.parametrize(
    "data,key,fix",
    [
        (FilesSource.Config(path="{docs}", val_fraction=0.0), "data.val_fraction", "data.val_path"),
        (FilesSource.Config(path="{docs}", val_path="/no/such/file.jsonl"), "data.val_path", "does not exist"),
    ],
)
def test_validation_data_errors(data, key, fix, documents):
    if data.path:
        data.path = str(documents)
    with pytest.raises(ConfigError) as info:
        resolve_validation_dataset(data)
    assert info.value.key == key and fix in str(info.value)


@pytest.mark.parametrize(
    "overrides,key,fix",
    [
        (["data=files", "data.val_split=validation"], "data.val_split", "no such key"),
        (["data.val_split=validation"], "data.val_split", "no such key"),
        (["data=files", "data.val_fraction=1.5"], "data.val_fraction", "< 1"),
    ],
)
def test_validation_keys_a_source_does_not_take_are_refused(overrides, key, fix, documents, tmp_path):
    """Each data source has its own schema: a key it does not read is refused while composing."""
    run_dir = tmp_path / "run"
    done = command_in_process([*overrides, *([f"data.path={documents}"] if "data=files" in overrides else [])], run_dir)
    assert done.returncode == 2 and key in done.stderr and fix in done.stderr, done.stderr
    assert not run_dir.exists()


def test_a_split_without_documents_is_refused_at_the_first_validation(tmp_path):
    path = tmp_path / "two.jsonl"
    path.write_text('{"text": "one"}\n{"text": "two"}\n')  # 1 % of 2 documents holds out none
    cfg = to_run_config(compose_config(["data=files", f"data.path={path}"], tmp_path))
    config = validator_config(cfg.validation, cfg.data, last_step=cfg.training.steps)
    validator = RunValidator(
        config,
        seq_len=64,
        local_batch_size=2,
        parallelism=None,
        dp_world_size=1,
        dp_rank=0,
        tokenizer=None,
        parallel_dims=None,
        loss_fn=None,
        validation_context=None,
        metrics_processor=None,
    )
    with pytest.raises(ValueError, match="holds no documents.*data.val_path.*validation=off"):
        validator.validate([], step=1)  # before torchtitan's loader would loop over nothing


# --------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------


def test_validation_is_on_by_default_and_off_switches_it_off(tmp_path):
    validator = prepare(to_run_config(compose_config([], tmp_path))).trainer_config.validator
    assert isinstance(validator, RunValidator.Config) and validator.enable
    assert (validator.freq, validator.steps, validator.last_step) == (10, 4, 40)
    assert validator.dataloader.dataset_path == str(validation_corpus_path())
    off = prepare(to_run_config(compose_config(["validation=off"], tmp_path))).trainer_config
    assert not off.validator.enable and off.metrics.validation_interval == 0


@pytest.mark.parametrize(
    "overrides,key",
    [
        (["validation.interval=0"], "validation.interval"),
        (["validation.steps=0"], "validation.steps"),
        (["validation.seq_len=8192"], "validation.seq_len"),
        (["launcher.nproc_per_node=2", "parallelism.pp=2", "parallelism.dp_shard=1", "validation.seq_len=64"], "validation.seq_len"),
    ],
)
def test_validation_config_errors(overrides, key, tmp_path):
    with pytest.raises(ConfigError) as info:
        prepare(to_run_config(compose_config([*overrides, "mode=plan"], tmp_path)))
    assert info.value.key == key


def test_metrics_line_of_a_validated_step_carries_the_held_out_loss(tmp_path):
    """metrics.jsonl keeps one line per step: a step a validation follows is written with it."""
    path = tmp_path / "metrics.jsonl"
    log = JsonlLogger(path, data_parallel=1, launch_time=None, validates=lambda step: step in (1, 3))
    log.log({TRAIN: 5.0, "throughput(tps)": 100.0}, 1)
    assert path.read_text() == ""  # waits for its validation
    log.log({VAL: 4.5}, 1)
    log.log({TRAIN: 4.8, "throughput(tps)": 100.0}, 2)
    log.log({TRAIN: 4.6, "throughput(tps)": 100.0}, 3)
    log.close()  # a validation that never came: the line is written anyway
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["step"], r["loss"], r.get("val_loss")) for r in lines] == [(1, 5.0, 4.5), (2, 4.8, None), (3, 4.6, None)]
    assert lines[0]["val_perplexity"] == pytest.approx(math.exp(4.5))


# --------------------------------------------------------------------------------------------
# Real runs
# --------------------------------------------------------------------------------------------

RUN = ["debug=smoke", "training.steps=4", "validation.interval=2", "validation.steps=3"]

# The same Trainer.Config straight through torchtitan's Python API, with torchtitan's own
# Validator (stock Validator.Config) on the held-out corpus registered here, and torchtitan's
# own MetricsProcessor; a logger records what it reports.
TITAN_DIRECT = """
import json, os, sys, hashlib
from hydra import compose, initialize_config_dir
from datasets import load_dataset
from torchtitan.components.metrics import BaseLogger, MetricsProcessor
from torchtitan.components.validate import Validator
from torchtitan.hf_datasets import DatasetConfig
from torchtitan.hf_datasets.text_datasets import DATASETS, HuggingFaceTextDataLoader
from qwen3_trn.app import to_run_config
from qwen3_trn.config.store import register_schema
from qwen3_trn.run.convert import compute_dtype, to_trainer_config
from qwen3_trn.data.embedded import validation_corpus_path
from qwen3_trn.devices import resolve_device
from qwen3_trn.run.layout import resolve_layout

out_dir, overrides = sys.argv[1], sys.argv[2:]
register_schema()
with initialize_config_dir(config_dir=os.path.abspath("conf"), version_base="1.3"):
    cfg = to_run_config(compose("config", overrides=[*overrides, f"output_dir={out_dir}"]))
device = resolve_device(cfg.device.type)
device.activate(compute_dtype(cfg, device))
config = to_trainer_config(cfg, device, resolve_layout(cfg.parallelism, 1, 1), cfg.backend.build())
DATASETS["held_out_direct"] = DatasetConfig(
    path=str(validation_corpus_path()),
    loader=lambda path: load_dataset("json", data_files=path, split="train"),
    sample_processor=lambda sample: sample["text"],
)
config.validator = Validator.Config(enable=True, freq=2, steps=3, dataloader=HuggingFaceTextDataLoader.Config(dataset="held_out_direct"))
config.metrics = MetricsProcessor.Config(log_freq=1, disable_color_printing=True)
import socket
with socket.socket() as sock:
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
os.environ.update({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})

class Record(BaseLogger):
    def __init__(self):
        self.train, self.val = {}, {}
    def log(self, metrics, step):
        if "validation_metrics/loss" in metrics:
            self.val[step] = metrics["validation_metrics/loss"]
        if "loss_metrics/global_avg_loss" in metrics:
            self.train[step] = metrics["loss_metrics/global_avg_loss"]

trainer = config.build()
record = trainer.metrics_processor.logger = Record()
trainer.train()
# the first 3 validation batches of torchtitan's own loader, hashed as the project documents it
loader = HuggingFaceTextDataLoader.Config(dataset="held_out_direct", infinite=True).build(
    dp_world_size=1, dp_rank=0, tokenizer=trainer.tokenizer, seq_len=cfg.training.seq_len, local_batch_size=cfg.training.local_batch_size)
digest, batches = hashlib.sha256(), iter(loader)
for _ in range(3):
    inputs, labels = next(batches)
    for ids in (inputs["input"], labels):
        digest.update(ids.to("cpu").long().contiguous().numpy().tobytes())
trainer.close()
print(json.dumps({"train": record.train, "val": record.val, "digest": digest.hexdigest()}))
"""


@pytest.mark.slow
def test_val_loss_is_torchtitans_validator_loss(tmp_path):
    """Same seed and data: the project's val_loss equals what torchtitan's own Validator reports,
    and the recorded digest is that of the tokens torchtitan's loader yields."""
    run_dir = tmp_path / "run"
    records = assert_trained(command_in_process(RUN, run_dir), run_dir, steps=4)
    project = {r["step"]: r["val_loss"] for r in records if "val_loss" in r}
    assert sorted(project) == [1, 2, 4]  # after step 1, every 2 steps, and the last step

    done = subprocess.run(
        [sys.executable, "-c", TITAN_DIRECT, str(tmp_path / "direct"), *RUN],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env=cli_env(),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    direct = json.loads(done.stdout.strip().splitlines()[-1])
    titan = {int(step): loss for step, loss in direct["val"].items()}
    print(f"val loss: project {project} torchtitan {titan}")
    assert sorted(titan) == [1, 2, 4]
    for step in titan:
        assert project[step] == pytest.approx(titan[step], abs=1e-6)
    # the training itself was the same
    assert [r["loss"] for r in records] == pytest.approx([direct["train"][str(s)] for s in (1, 2, 3, 4)], abs=1e-6)

    summary = read_summary(run_dir)
    assert summary["val_loss"] == project[4] and summary["val_step"] == 4 and summary["validations"] == 3
    assert summary["val_perplexity"] == pytest.approx(math.exp(project[4]))
    assert summary["validation_tokens_sha256"] == direct["digest"]
    assert summary["validation_tokens"] == 3 * 2 * 64


@pytest.mark.slow
def test_validation_off_trains_without_held_out_figures(tmp_path):
    run_dir = tmp_path / "run"
    result = command_in_process(["validation=off", *RUN], run_dir)
    records = assert_trained(result, run_dir, steps=4)
    assert not any("val_loss" in r for r in records) and "val_loss" not in result.stdout
    summary = read_summary(run_dir)
    assert summary["status"] == "completed" and "val_loss" not in summary and "validation_tokens_sha256" not in summary
