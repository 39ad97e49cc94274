"""mode=plan and mode=check describe a run without starting a trainer (through the command's
entry point in this process; tests/test_errors.py and tests/test_smallest_runs.py start real ones)."""

from __future__ import annotations

import json

import pytest

from tests.commands import command_in_process


def test_plan_for_trainium_prints_world_torchrun_and_trainer_config(run_dir):
    result = command_in_process(["mode=plan", "model=4B", "experiment=trn2_48xlarge", "compile=neuron", "device=neuron"], run_dir)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    # AWS's recipe layout on trn2.48xlarge: TP4 x FSDP16, selective activation checkpointing
    assert "world 64 = 1 node(s) x 64 rank(s): dp_replicate=1, dp_shard=16, cp=1, tp=4, pp=1, ep=1" in out
    assert "NeuronCore LOCAL_RANK" in out
    assert (
        f"NEURON_LOGICAL_NC_CONFIG=2 torchrun --nnodes=1 --nproc_per_node=64 --rdzv_backend=c10d "
        f"--rdzv_endpoint=localhost:0 --local-ranks-filter=0 --role=rank --tee=3 -m qwen3_trn.rank {run_dir}/config.yaml"
    ) in out
    # the full Trainer.Config goes to a file whose path the plan prints
    assert f"torchtitan Trainer.Config: {run_dir}/trainer_config.json" in out and '"grad_clip"' not in out
    trainer_config = (run_dir / "trainer_config.json").read_text()
    assert '"backend": "neuron"' in trainer_config and '"grad_clip"' in trainer_config
    assert "activation_checkpoint: selective" in (run_dir / "config.yaml").read_text()
    assert (run_dir / "plan.txt").read_text() == out
    assert not (run_dir / "metrics.jsonl").exists()
    # torchtitan-neuron's fork compiles grad_clip (compile=neuron's list); upstream, here, does not
    assert "compile.components: grad_clip will not be compiled" in result.stderr


@pytest.mark.slow
def test_check_builds_rank0_of_64_on_fake_backend(run_dir):
    result = command_in_process(["mode=check", "model=4B", "model.n_layers=2", "experiment=trn2_48xlarge", "device=neuron"], run_dir)
    assert result.returncode == 0, result.stderr[-3000:]
    check = json.loads(result.stdout.split("== Fake-backend check ==")[1].strip().splitlines()[0])
    assert check["world_size"] == 64
    # TP4 x FSDP16 shards the parameters 64 ways: rank 0 holds about 1/64 of them
    assert check["parameters"] / 80 < check["rank0_local_parameters"] < check["parameters"] / 50


def test_plan_of_the_largest_moe_fits_on_a_screen_and_reads_as_written(run_dir):
    """A plan a person reads: about a screen for any model (the per-layer Trainer.Config is in a
    file), values as a user writes them (no Python or Enum reprs)."""
    result = command_in_process(["mode=plan", "backend=nki_moe", "model=30B-A3B", "logger=none"], run_dir)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert len(out.splitlines()) <= 150, len(out.splitlines())
    for section in ("Overrides and differences", "World", "Memory and compute per rank", "Equivalent torchrun command", "Files"):
        assert f"== {section}" in out
    assert "logger.backends: [wandb] -> []" in out and "backend.name: native -> nki_moe" in out
    assert "<" not in out.split("== World ==")[0].replace("<absent>", ""), "a Python repr in the differences"
    assert f"resolved config: {run_dir}/config.yaml" in out
    assert len((run_dir / "trainer_config.json").read_text().splitlines()) > 1000  # the full dump, one block per layer


@pytest.mark.parametrize("model", ["8B", "30B-A3B"])
def test_plan_on_trn2_with_parallelism_auto_shows_aws_layout_without_expert_parallel(model, run_dir):
    args = ["mode=plan", "device=neuron", "experiment=trn2_48xlarge", f"model={model}", "parallelism=auto", f"hydra.run.dir={run_dir}"]
    result = command_in_process(args)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "world 64 = 1 node(s) x 64 rank(s): dp_replicate=1, dp_shard=16, cp=1, tp=4, pp=1, ep=1" in result.stdout
    assert "layout chosen by parallelism=auto: dp_shard=16, tp=4:" in result.stdout


def test_expert_parallel_on_trn2_exits_2_with_one_paragraph(run_dir):
    args = ["mode=plan", "device=neuron", "experiment=trn2_48xlarge", "model=30B-A3B", "parallelism.ep=8", f"hydra.run.dir={run_dir}"]
    result = command_in_process(args)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    error = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "parallelism.ep" in error[0] and "trn2.48xlarge" in error[0]
    assert "ProcessGroupNeuron.alltoall_base" in error[0] and "NotImplementedError" in error[0]
