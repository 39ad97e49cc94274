"""backend=nki_moe: the kernel-backed MoE trains, records its kernel, and refuses what cannot run."""

from __future__ import annotations

import pytest

from qwen3_trn.app import execute, to_run_config
from qwen3_trn.common.errors import ConfigError, NotApplicable
from qwen3_trn.kernels import KernelGroupedExperts
from qwen3_trn.results.records import read_summary
from qwen3_trn.run.preflight import prepare
from tests.commands import command_in_process, command_in_subprocess
from tests.conftest import FAST, assert_trained, compose_config


def test_seed_reduced_moe_swaps_every_expert_module(tmp_path):
    cfg = compose_config(
        ["backend=nki_moe", "model=30B-A3B", "model.n_layers=4", "model.num_experts=64", "model.top_k=4", "mode=plan"], tmp_path
    )
    prepared = prepare(to_run_config(cfg))
    experts = [layer.moe.routed_experts.inner_experts for layer in prepared.trainer_config.model_spec.model.layers]
    assert len(experts) == 4
    assert all(isinstance(e, KernelGroupedExperts.Config) and e.kernel == "auto" for e in experts)
    assert all(layer.moe.router.top_k == 4 for layer in prepared.trainer_config.model_spec.model.layers)
    assert prepared.trainer_config.metrics.run_info["kernel"] == "grouped_mm"


def test_kernels_nki_without_nki_says_what_is_missing(tmp_path):
    with pytest.raises(ConfigError) as info:
        execute(compose_config(["backend=nki_moe", "backend.kernels=nki", "device=neuron", "mode=plan"], tmp_path / "run"))
    assert info.value.key == "backend.kernels"
    assert "torch_neuronx" in str(info.value) or "torch-neuronx" in str(info.value)


def test_kernels_nki_on_cpu_is_refused(tmp_path):
    with pytest.raises(ConfigError) as info:
        execute(compose_config(["backend=nki_moe", "backend.kernels=nki"], tmp_path / "run"))
    assert info.value.key == "backend.kernels" and "neuron" in str(info.value)


def test_dense_model_does_not_apply(tmp_path):
    with pytest.raises(NotApplicable) as info:
        execute(compose_config(["backend=nki_moe", "model=tiny"], tmp_path / "run"))
    assert info.value.key == "backend.name" and "tiny_moe" in str(info.value)


@pytest.mark.slow
def test_nki_moe_trains_on_cpu_with_portable_kernel(run_dir):
    result = command_in_process(["backend=nki_moe", "logger=none", *FAST], run_dir)
    records = assert_trained(result, run_dir, steps=6)
    assert records[-1]["loss"] < records[0]["loss"] - 0.2, [r["loss"] for r in records]
    summary = read_summary(run_dir)
    assert summary["kernel"] == "grouped_mm" and summary["kernels_requested"] == "auto"
    assert "kernel grouped_mm" in result.stdout


@pytest.mark.slow
def test_nki_moe_compiles_with_inductor(run_dir):
    result = command_in_subprocess(
        ["backend=nki_moe", "compile=inductor", "logger=none", "training.steps=3", "optimizer.warmup_steps=1", "training.seq_len=64"],
        run_dir,
        timeout=900,
    )
    records = assert_trained(result, run_dir, steps=3)
    assert all(r["loss"] > 0 for r in records)
    assert read_summary(run_dir)["kernel"] == "grouped_mm"
