"""Will it fit: parameter counts of the presets, the memory model, the fit check, parallelism=auto."""

from __future__ import annotations

import dataclasses
import json

import pytest

from qwen3_trn.app import to_run_config
from qwen3_trn.backends.base import flavor_architecture
from qwen3_trn.common.errors import ConfigError
from qwen3_trn.results.records import CACHE_ENV, read_summary
from qwen3_trn.run.fit import probe
from qwen3_trn.run.fit.counts import count
from qwen3_trn.run.fit.memory import GIB
from qwen3_trn.run.fit.tracked import isolated, rank0_parameters, trainer_flops_per_token
from qwen3_trn.run.preflight import prepare
from tests.commands import command_in_process
from tests.conftest import CONF, command_in_process, compose_config

# Qwen3 model cards (huggingface.co/Qwen/Qwen3-<size>): "Number of Parameters" (embeddings
# included, a tied embedding counted once), "Number of Parameters (Non-Embedding)" (without the
# input embedding and an untied output projection), and for MoE the activated parameters.
PUBLISHED = {
    "0.6B": (0.6e9, 0.44e9, None),
    "1.7B": (1.7e9, 1.4e9, None),
    "4B": (4.0e9, 3.6e9, None),
    "8B": (8.2e9, 6.95e9, None),
    "14B": (14.8e9, 13.2e9, None),
    "32B": (32.8e9, 31.2e9, None),
    "30B-A3B": (30.5e9, 29.9e9, 3.3e9),
    "235B-A22B": (235e9, 234e9, 22e9),
}
# torchtitan's debug flavors and the project's cut of them: no published figures.
DEBUG_PRESETS = {"tiny", "tiny_moe", "debugmodel", "debugmodel_moe", "debugmodel_non_fused_qkv"}


def _cfg(overrides: list[str]):
    return to_run_config(compose_config([*overrides, "logger=none"]))


def _counts(preset: str, seq_len: int = 4096):
    cfg = _cfg([f"model={preset}"])
    return count(cfg.model.flavor, flavor_architecture(cfg), seq_len)


def test_every_model_preset_has_a_parameter_count_check():
    assert {path.stem for path in (CONF / "model").glob("*.yaml")} == set(PUBLISHED) | DEBUG_PRESETS


@pytest.mark.parametrize("preset", sorted(PUBLISHED))
def test_preset_parameter_counts_match_the_qwen3_model_cards(preset):
    counts = _counts(preset)
    total, non_embedding, active = PUBLISHED[preset]
    assert counts.total == pytest.approx(total, rel=0.02)
    assert counts.non_embedding == pytest.approx(non_embedding, rel=0.02)
    if active is None:
        assert counts.active == counts.total
    else:
        assert counts.active == pytest.approx(active, rel=0.02)


@pytest.mark.parametrize("preset", ["tiny", "tiny_moe"])
def test_flops_per_token_is_the_count_torchtitan_trainer_uses(preset):
    cfg = _cfg([f"model={preset}", "mode=check"])
    prepared = prepare(cfg)
    assert prepared.fit.counts.flops_per_token == isolated(trainer_flops_per_token, cfg, prepared.layout)


def test_plan_prints_the_fit_table_and_records_it_in_plan_json(run_dir):
    result = command_in_process(["mode=plan", "logger=none"], run_dir)
    assert result.returncode == 0, result.stderr[-3000:]
    section = result.stdout.split("== Memory and compute per rank (will it fit?) ==")[1].split("==")[0]
    for column in ("params", "grads", "optimizer", "activations", "total"):
        assert column in section
    assert "fits: yes, headroom" in section and "host RAM available" in section
    record = json.loads((run_dir / "plan.json").read_text())["fit"]
    assert record["fits"] is True
    assert record["parameters"]["total"] == _counts("tiny", seq_len=256).total
    assert record["memory_per_rank"]["source"] == "composed"
    assert 0 < record["memory_per_rank"]["total_gib"] < record["device_memory"]["per_rank_gib"]


def test_fit_check_refuses_the_30b_a3b_command_on_this_machine(tmp_path, monkeypatch):
    # The default run directory, outputs/runs/<date>/<time> under the working directory, made by
    # Hydra's entry point (in this process)
    monkeypatch.chdir(tmp_path)
    result = command_in_process(["backend=nki_moe", "model=30B-A3B"])
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    err = result.stderr
    assert "error: fit: rank 0 needs" in err and "nothing was started" in err
    for part in ("params", "grads", "optimizer", "activations", "margin", "30.53 B parameters", "3.35 B active"):
        assert part in err
    remedies = err.split("What would make it fit, most preferred first:")[1]
    assert "model=debugmodel_moe" in remedies and "device=neuron parallelism=auto" in remedies
    assert "mode=plan" in remedies and "fit.check=false" in remedies
    assert list((tmp_path / "outputs" / "runs").iterdir()) == [], "neither the run directory nor its date folder may stay"


def test_device_memory_comes_from_the_setting_or_the_accelerator_table():
    assert prepare(_cfg(["mode=plan", "device.memory_gib=3.5"])).fit.budget.per_rank == int(3.5 * GIB)
    h200 = prepare(_cfg(["mode=plan", "device=cuda", "device.accelerator=h200", "launcher.nproc_per_node=8"]))
    assert h200.fit.budget.per_rank == int(140.4 * GIB) and "H200" in h200.fit.budget.source
    trn2 = prepare(_cfg(["mode=plan", "device=neuron", "launcher.nproc_per_node=-1"]))
    assert trn2.layout.world_size == 64 and trn2.fit.budget.per_rank == 24 * GIB
    with pytest.raises(ConfigError, match="device.accelerator: 'trn2' is a neuron device"):
        prepare(_cfg(["mode=plan", "device=cuda", "device.accelerator=trn2", "launcher.nproc_per_node=8"]))


def test_cpu_ranks_share_the_host_memory():
    one = prepare(_cfg(["mode=plan"])).fit.budget
    two = prepare(_cfg(["mode=plan", "launcher.nproc_per_node=2"])).fit.budget
    assert two.sharing == 2 and two.per_rank == pytest.approx(one.per_rank / 2, rel=0.1)


@pytest.mark.slow
def test_fit_check_false_starts_a_run_the_estimate_refuses(run_dir, tmp_path):
    small = ["model=tiny", "device.memory_gib=0.5", "training.steps=2", "optimizer.warmup_steps=1", "logger=none"]
    refused = command_in_process(small, tmp_path / "refused")
    assert refused.returncode == 2 and "error: fit:" in refused.stderr and "Traceback" not in refused.stderr
    result = command_in_process([*small, "fit.check=false"], run_dir)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = read_summary(run_dir)
    assert summary["status"] == "completed" and summary["fit"]["fits"] is False


# (overrides, what the chosen layout must have)
AUTO_CASES = {
    "30B-A3B on a trn2.48xlarge": (["backend=nki_moe", "model=30B-A3B", "device=neuron"], {"world_size": 64}),
    "8B on 8 H100": (["model=8B", "device=cuda", "launcher.nproc_per_node=8"], {"world_size": 8}),
    "32B on two nodes of 8 A100-40GB": (
        ["model=32B", "device=cuda", "device.accelerator=a100-40gb", "launcher.nproc_per_node=8", "launcher.nnodes=2"],
        {"world_size": 16},
    ),
    "debugmodel on this CPU's 2 cores": (["model=debugmodel", "launcher.nproc_per_node=2"], {"world_size": 2}),
}


@pytest.mark.parametrize("case", sorted(AUTO_CASES))
def test_parallelism_auto_picks_a_layout_that_fits(case):
    overrides, expected = AUTO_CASES[case]
    prepared = prepare(_cfg([*overrides, "parallelism=auto", "mode=plan"]))
    layout, report = prepared.layout, prepared.fit
    assert layout.world_size == expected["world_size"]
    assert layout.dp_replicate * layout.dp_shard * layout.tp * layout.pp * layout.cp == layout.world_size
    assert report.fits and report.choice and "layouts of" in report.choice
    # the degrees are written into the config every rank starts from
    assert not prepared.cfg.parallelism.auto and prepared.cfg.parallelism.dp_shard == layout.dp_shard


def test_parallelism_auto_uses_expert_parallel_for_the_moe_model_and_says_why():
    prepared = prepare(
        _cfg(["backend=nki_moe", "model=30B-A3B", "device=cuda", "launcher.nproc_per_node=8", "parallelism=auto", "mode=plan"])
    )
    assert prepared.layout.ep > 1 and prepared.fit.choice.startswith(f"dp_shard={prepared.layout.dp_shard}")
    assert f"ep={prepared.layout.ep}" in prepared.fit.choice and "FSDP alone" in prepared.fit.choice


@pytest.mark.parametrize("model", ["8B", "30B-A3B"])
def test_parallelism_auto_on_trn2_picks_only_aws_layout(model):
    """AWS's TorchTitan Neuron recipes on trn2.48xlarge: TP4 x FSDP16, no expert parallel."""
    prepared = prepare(_cfg([f"model={model}", "device=neuron", "parallelism=auto", "mode=plan"]))
    layout = prepared.layout
    assert (layout.tp, layout.dp_shard, layout.ep, layout.pp, layout.world_size) == (4, 16, 1, 1, 64)
    assert "AWS's layouts on trn2.48xlarge" in prepared.fit.choice and "FSDP alone" not in prepared.fit.choice


def test_parallelism_auto_on_trn2_refuses_a_world_without_aws_layout():
    with pytest.raises(ConfigError, match="parallelism=auto on trn2.48xlarge .LNC=2. picks only the layouts AWS runs there"):
        prepare(_cfg(["model=8B", "device=neuron", "launcher.nproc_per_node=2", "parallelism=auto", "mode=plan"]))


@pytest.mark.parametrize("accelerator", ["trn2", "trn2-lnc1", "trn1"])
def test_explicit_expert_parallel_on_trainium_is_refused_naming_the_all_to_all(accelerator):
    args = ["backend=nki_moe", "model=30B-A3B", "device=neuron", f"device.accelerator={accelerator}", "mode=plan"]
    with pytest.raises(ConfigError) as refused:
        prepare(_cfg([*args, "launcher.nproc_per_node=64", "parallelism.ep=8"]))
    message = str(refused.value)
    assert message.startswith("parallelism.ep: expert parallel (ep=8) cannot run on trn")
    assert "ProcessGroupNeuron.alltoall_base" in message and "NotImplementedError for uneven split sizes" in message
    assert "\n" not in message


def test_parallelism_auto_refuses_when_no_layout_of_the_ranks_fits():
    with pytest.raises(ConfigError, match="parallelism: parallelism=auto found no layout of 8 ranks that fits"):
        prepare(
            _cfg(["model=32B", "device=cuda", "device.accelerator=a100-40gb", "launcher.nproc_per_node=8", "parallelism=auto", "mode=plan"])
        )


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(AUTO_CASES))
def test_chosen_layouts_build_rank0_on_the_fake_backend(case):
    overrides, _ = AUTO_CASES[case]
    prepared = prepare(_cfg([*overrides, "parallelism=auto", "mode=check"]))
    cut = dataclasses.replace(prepared.cfg, model=dataclasses.replace(prepared.cfg.model, n_layers=2 * prepared.layout.pp))
    total, local = isolated(rank0_parameters, cut, prepared.layout)
    shards = prepared.layout.dp_shard * prepared.layout.tp * prepared.layout.pp
    assert total / shards * 0.8 < local < total / shards * 1.5 + 1e6


@pytest.mark.slow
@pytest.mark.parametrize("overrides", [["model=tiny"], ["model=debugmodel", "launcher.nproc_per_node=4", "parallelism.tp=2"]])
def test_composed_estimate_agrees_with_the_tracker(overrides):
    from qwen3_trn.rank import check_layout

    prepared = prepare(_cfg([*overrides, "mode=check"]))
    tracked = check_layout(_cfg(overrides))["tracked"]["bytes"]
    assert prepared.fit.memory.peak == pytest.approx(tracked["peak"], rel=0.10)
    for name in ("params", "grads", "optimizer"):
        assert getattr(prepared.fit.memory, name) == pytest.approx(tracked[name], rel=0.05)


def test_an_activation_profile_is_measured_once_then_read_from_the_cache(tmp_path, monkeypatch):
    """Every run's fit check needs the profile of its model; the second check of the same model
    reads the first one's from the disk cache instead of measuring again. The model config is
    built anew each time: its key must not hold what differs between two builds (the object
    addresses in the reprs of its param_init closures)."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    measured = []
    measure = probe._measure
    monkeypatch.setattr(probe, "_measure", lambda *args: measured.append(args) or measure(*args))
    first, second = (prepare(_cfg(["model=tiny", "mode=plan"])).fit.memory for _ in range(2))
    assert len(measured) == 1
    assert first == second
    assert len(json.loads((tmp_path / "cache" / "fit_activations.json").read_text())) == 1
