"""The composed config reaches torchtitan's Trainer.Config field by field."""

from __future__ import annotations

import pytest
from torchtitan.components.checkpoint import CheckpointManager
from torchtitan.distributed.activation_checkpoint import FullAC
from torchtitan.hf_datasets.text_datasets import DATASETS
from torchtitan.models.common.attention import FlexAttention, ScaledDotProductAttention
from torchtitan.models.qwen3 import parallelize_qwen3

from qwen3_trn.app import to_run_config
from qwen3_trn.common.errors import ConfigError
from qwen3_trn.run.convert import resume_checkpoint
from qwen3_trn.run.preflight import prepare
from tests.conftest import compose_config


def _trainer_config(overrides, tmp_path):
    return prepare(to_run_config(compose_config(overrides, tmp_path))).trainer_config


def test_training_optimizer_checkpoint_compile_logger_fields(tmp_path):
    tc = _trainer_config(
        [
            "training.steps=17",
            "training.local_batch_size=3",
            "training.global_batch_size=6",
            "training.seq_len=96",
            "training.max_norm=0.5",
            "training.seed=7",
            "training.deterministic=true",
            "training.mixed_precision_param=bfloat16",
            "training.activation_checkpoint=full",
            "optimizer.lr=0.001",
            "optimizer.weight_decay=0.01",
            "optimizer.beta1=0.8",
            "optimizer.beta2=0.9",
            "optimizer.eps=1e-6",
            "optimizer.warmup_steps=3",
            "optimizer.decay_type=cosine",
            "optimizer.min_lr_factor=0.1",
            "checkpoint=on",
            "checkpoint.interval=5",
            "checkpoint.keep_latest_k=2",
            "compile=inductor",
            "logger=tensorboard",
            "logger.log_freq=2",
        ],
        tmp_path,
    )
    t = tc.training
    assert (t.steps, t.local_batch_size, t.global_batch_size, t.seq_len, t.max_norm) == (17, 3, 6, 96, 0.5)
    assert t.mixed_precision_param == "bfloat16"
    assert (tc.debug.seed, tc.debug.deterministic) == (7, True)
    assert isinstance(tc.activation_checkpoint, FullAC.Config)
    (group,) = tc.optimizer.param_groups
    assert group.optimizer_name == "AdamW"
    assert group.optimizer_kwargs == {"lr": 0.001, "betas": (0.8, 0.9), "eps": 1e-6, "weight_decay": 0.01}
    s = tc.lr_scheduler
    assert (s.warmup_steps, s.decay_type, s.min_lr_factor) == (3, "cosine", 0.1)
    assert isinstance(tc.checkpoint, CheckpointManager.Config)
    assert (tc.checkpoint.enable, tc.checkpoint.interval, tc.checkpoint.keep_latest_k) == (True, 5, 2)
    assert tc.compile.enable and tc.compile.backend == "inductor" and tc.compile.components == ["model", "loss"]
    assert tc.metrics.enable_tensorboard and not tc.metrics.enable_wandb and tc.metrics.log_freq == 2
    assert tc.dump_folder == str(tmp_path)


def test_cpu_gets_sdpa_and_gloo_safe_fsdp(tmp_path):
    tc = _trainer_config(["device=cpu"], tmp_path)
    inner = [layer.attention.inner_attention for layer in tc.model_spec.model.layers]
    assert inner and all(isinstance(a, ScaledDotProductAttention.Config) for a in inner)
    # wrapped by the CPU adapter, which forces SUM reductions for gloo
    assert tc.model_spec.parallelize_fn.__wrapped__ is parallelize_qwen3
    # no CUDA graphs to replay: gradients are freed between steps, not zero-filled
    assert tc.training.disable_cuda_graphs
    # one rank (parallelism=single): the bf16 parameter copies are kept for backward
    assert tc.parallelism.fsdp_reshard_after_forward == "never"


def test_cuda_plan_keeps_flex_attention_and_torchtitan_parallelize(tmp_path):
    tc = _trainer_config(["device=cuda", "mode=plan", "model=0.6B", "parallelism=fsdp", "launcher.nproc_per_node=8"], tmp_path)
    assert all(isinstance(layer.attention.inner_attention, FlexAttention.Config) for layer in tc.model_spec.model.layers)
    assert tc.model_spec.parallelize_fn is parallelize_qwen3
    assert tc.parallelism.data_parallel_shard_degree == 8
    assert not tc.training.disable_cuda_graphs
    assert tc.parallelism.fsdp_reshard_after_forward == "default"


def test_parallel_degrees_and_the_rest(tmp_path):
    tc = _trainer_config(["mode=plan", "launcher.nproc_per_node=64", "parallelism.tp=4", "parallelism.dp_shard=-1"], tmp_path)
    p = tc.parallelism
    assert (p.data_parallel_shard_degree, p.tensor_parallel_degree, p.data_parallel_replicate_degree) == (16, 4, 1)
    tc = _trainer_config(["mode=plan", "experiment=trn2_multinode"], tmp_path)
    p = tc.parallelism
    assert (p.data_parallel_replicate_degree, p.data_parallel_shard_degree, p.tensor_parallel_degree) == (2, 16, 4)


def test_embedded_data_is_registered_with_torchtitan(tmp_path):
    tc = _trainer_config([], tmp_path)
    entry = DATASETS[tc.dataloader.dataset]
    assert tc.dataloader.dataset_path.endswith("corpus.jsonl.gz")
    dataset = entry.loader(tc.dataloader.dataset_path)
    assert len(dataset) > 100 and len(entry.sample_processor(dataset[0])) > 100


def test_files_source_reads_a_text_column(tmp_path):
    data = tmp_path / "mine.jsonl"
    data.write_text('{"body": "first document"}\n{"body": "second document"}\n')
    tc = _trainer_config(["data=files", f"data.path={data}", "data.text_column=body"], tmp_path)
    entry = DATASETS[tc.dataloader.dataset]
    dataset = entry.loader(tc.dataloader.dataset_path)  # in the order the run's seed shuffles them into
    assert sorted(entry.sample_processor(row) for row in dataset) == ["first document", "second document"]


def test_titan_escape_hatch_sets_real_fields(tmp_path):
    tc = _trainer_config(["+titan.comm.init_timeout_seconds=601", "+titan.training.gc_freq=7"], tmp_path)
    assert tc.comm.init_timeout_seconds == 601 and tc.training.gc_freq == 7


def test_titan_escape_hatch_suggests_close_names(tmp_path):
    with pytest.raises(ConfigError, match=r"titan.comm.init_timeout_secs.*init_timeout_seconds"):
        _trainer_config(["+titan.comm.init_timeout_secs=5"], tmp_path)


def test_resume_from_picks_latest_complete_step(tmp_path):
    old = tmp_path / "old"
    for step in (3, 12, 6, 15):
        (old / "checkpoint" / f"step-{step}").mkdir(parents=True)
        if step != 15:  # step-15: a save that did not finish (no .metadata)
            (old / "checkpoint" / f"step-{step}" / ".metadata").write_bytes(b"")
    tc = _trainer_config([f"checkpoint.resume_from={old}"], tmp_path / "new")
    assert tc.checkpoint.enable and tc.checkpoint.initial_load_path.endswith("step-12")
    assert tc.checkpoint.initial_load_model_only is False
    point = resume_checkpoint(to_run_config(compose_config([f"checkpoint.resume_from={old}"], tmp_path / "new")).checkpoint)
    assert point.skipped == [(old / "checkpoint" / "step-15", point.skipped[0][1])] and "no .metadata" in point.skipped[0][1]
