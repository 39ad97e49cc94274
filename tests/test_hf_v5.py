"""backend=hf_v5: Qwen3 built by Transformers v5 inside torchtitan's transformers_modeling_backend,
with Hugging Face safetensors in and out. Real CPU training, real checkpoints, no mocks."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from qwen3_trn.app import execute, to_run_config
from qwen3_trn.common.errors import ConfigError
from qwen3_trn.results.records import read_metrics, read_summary
from tests.commands import OFFLINE, cli_env, command_in_process
from tests.conftest import (
    HF_EXPORT_STEPS,
    HF_V5_DENSE,
    NATIVE_DENSE,
    REPO,
    assert_trained,
    compose_config,
    hf_export_run,
)
from tests.hf_checkpoints import DENSE, MOE, make_random_hf_checkpoint, read_config

# The smallest run (conf/debug/smoke.yaml) at 4 steps (fp32 on this CPU).
TINY_RUN = ["debug=smoke", "training.steps=4"]


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    for key, value in OFFLINE.items():
        monkeypatch.setenv(key, value)


def _falls(records, by=0.15):
    return records[-1]["loss"] < records[0]["loss"] - by


def _held_out_falls(run_dir, by):
    """The held-out loss (the same tokens after the first and the last step) fell by ``by``."""
    val = [r["val_loss"] for r in read_metrics(run_dir) if "val_loss" in r]
    return len(val) == 2 and val[-1] < val[0] - by


def _python(code: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter. Transformers reference models are loaded there:
    building torchtitan's HFTransformerModel monkeypatches transformers' weight init for the
    rest of a process (see qwen3_trn.hf.reference.in_clean_process)."""

    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=cli_env(),
    )


LOAD_WITH_TRANSFORMERS = """
import json, sys, torch
from transformers import AutoModelForCausalLM
model, info = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32, output_loading_info=True)
tokens = torch.arange(32).unsqueeze(0) * 7 % model.config.vocab_size
with torch.no_grad():
    logits = model(tokens).logits
print(json.dumps({
    "class": type(model).__name__,
    "missing": sorted(info["missing_keys"]), "unexpected": sorted(info["unexpected_keys"]),
    "mismatched": [str(k) for k in info["mismatched_keys"]],
    "finite": bool(torch.isfinite(logits).all()), "params": sum(p.numel() for p in model.parameters()),
    "tied": model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr(),
}))
"""


def _load_with_transformers(folder: Path) -> dict:
    done = _python(LOAD_WITH_TRANSFORMERS, str(folder))
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------------------------
# Real training (dense and MoE), HF export, fine-tuning from HF weights, loss parity
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dense_run(shared_run) -> tuple[Path, list[dict]]:
    """backend=hf_v5 on the default model (model=tiny), exporting HF safetensors at the end: the
    session's run that tests/test_hf_export.py checks against torchtitan."""
    run = hf_export_run(shared_run, HF_V5_DENSE)
    return run.run_dir, assert_trained(run.result, run.run_dir, steps=HF_EXPORT_STEPS)


@pytest.mark.slow
def test_default_hf_v5_run_trains_offline_and_exports_hf(dense_run):
    run_dir, records = dense_run
    assert _falls(records), [r["loss"] for r in records]
    summary = read_summary(run_dir)
    assert (summary["backend"], summary["device"], summary["status"]) == ("hf_v5", "cpu", "completed")
    assert summary["hf_architecture"] == "Qwen3ForCausalLM"
    assert summary["hf_attention"] == "qwen3_trn_causal_sdpa"  # the CPU attention path
    trainer_config = json.loads((run_dir / "trainer_config.json").read_text())
    assert trainer_config["model_spec"]["name"] == "transformers_modeling_backend"
    # torchtitan read the config.json the backend wrote; it lists `architectures`
    hf_config = json.loads((Path(trainer_config["hf_model"]) / "config.json").read_text())
    assert hf_config["architectures"] == ["Qwen3ForCausalLM"] and hf_config["num_hidden_layers"] == 2

    export = run_dir / "hf" / f"step-{HF_EXPORT_STEPS}"
    assert (export / "config.json").is_file() and list(export.glob("*.safetensors"))
    loaded = _load_with_transformers(export)
    assert loaded["class"] == "Qwen3ForCausalLM"
    assert loaded["missing"] == [] and loaded["unexpected"] == [] and loaded["mismatched"] == []
    assert loaded["finite"] and loaded["tied"]
    # the same parameter count torchtitan trained: tied embeddings stayed tied
    assert loaded["params"] == 2_098_688


@pytest.mark.slow
def test_finetune_from_hf_weights_loads_them_before_step_one(dense_run, tmp_path):
    """model.hf_model and checkpoint.initial_load_path both point at the exported HF directory;
    with lr=0 the weights cannot move, so the new export must equal the loaded one exactly."""
    first_dir, first = dense_run
    export = first_dir / "hf" / f"step-{HF_EXPORT_STEPS}"
    run_dir = tmp_path / "run"
    result = command_in_process(
        [
            "backend=hf_v5",
            "model=0.6B",
            f"model.hf_model={export}",
            f"checkpoint.initial_load_path={export}",
            "checkpoint=hf_export",
            "optimizer.lr=0",
            "debug=smoke",
            "training.steps=2",
        ],
        run_dir,
    )
    records = assert_trained(result, run_dir, steps=2)
    # the same first batch, now seen by the trained weights: clearly lower than at init
    assert records[0]["loss"] < first[0]["loss"] - 0.2, (records[0]["loss"], first[0]["loss"])
    from safetensors.torch import load_file

    before = load_file(str(next(export.glob("*.safetensors"))))
    after = load_file(str(next((run_dir / "hf" / "step-2").glob("*.safetensors"))))
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)


@pytest.mark.slow
def test_loss_parity_with_native(dense_run, shared_run):
    """Same architecture (model=tiny), seed, data and steps: comparable start, both decrease.
    The native run is the session's native export run (tests/test_hf_export.py)."""
    _, hf_records = dense_run
    native = hf_export_run(shared_run, NATIVE_DENSE)
    native_records = assert_trained(native.result, native.run_dir, steps=HF_EXPORT_STEPS)
    hf_losses = [r["loss"] for r in hf_records]
    native_losses = [r["loss"] for r in native_records]
    print(f"loss parity: native {native_losses} hf_v5 {hf_losses}")
    assert abs(hf_losses[0] - native_losses[0]) < 0.1, (native_losses, hf_losses)
    assert _falls(native_records) and _falls(hf_records)
    assert abs(hf_losses[-1] - native_losses[-1]) < 0.3, (native_losses, hf_losses)


@pytest.mark.slow
def test_moe_hf_v5_trains_and_exports_standard_qwen3_moe(tmp_path):
    run_dir = tmp_path / "run"
    result = command_in_process(
        [
            "backend=hf_v5",
            "model=tiny_moe",
            "model.num_experts=4",
            "model.moe_hidden_dim=128",
            "backend.hf_experts_implementation=eager",
            "checkpoint=hf_export",
            "checkpoint.export_dtype=bfloat16",
            *TINY_RUN,
        ],
        run_dir,
    )
    records = assert_trained(result, run_dir, steps=4)
    # the fourth training batch of the seed's document order scores above the first; the
    # held-out tokens are the same at both evaluations
    assert _held_out_falls(run_dir, by=0.1), [r["loss"] for r in records]
    summary = read_summary(run_dir)
    assert summary["hf_architecture"] == "Qwen3MoeForCausalLM" and summary["hf_experts_implementation"] == "eager"
    assert summary["architecture"]["num_experts"] == 4
    export = run_dir / "hf" / "step-4"
    from qwen3_trn.hf.checkpoint import checkpoint_shapes

    keys = checkpoint_shapes(export)
    # in the chosen dtype (checkpoint.export_dtype), and config.json says so
    assert {dtype for _, dtype in keys.values()} == {"BF16"}
    # standard per-expert Qwen3-MoE layout, no torchtitan-only buffers
    assert keys["model.layers.1.mlp.experts.3.down_proj.weight"][0] == (256, 128)
    assert keys["model.layers.0.mlp.gate.weight"][0] == (4, 256)
    assert not any("expert_bias" in k or "router" in k or "routed_experts" in k for k in keys)
    # exactly the tensors transformers' Qwen3MoeForCausalLM has (test_roundtrip_moe loads this
    # layout with transformers); config.json describes them
    from qwen3_trn.hf.checkpoint import check_hf_checkpoint

    check_hf_checkpoint(str(export), read_config(export))
    assert read_config(export)["architectures"] == ["Qwen3MoeForCausalLM"] and read_config(export)["dtype"] == "bfloat16"


# --------------------------------------------------------------------------------------------
# HF save/load round trip
# --------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_roundtrip_command_tied_dense(tmp_path, capsys):
    """The command on a sharded bf16 tied Qwen3 whose safetensors also carry lm_head.weight: the
    copy drops only that (acceptable for tied embeddings), tensors and logits match."""
    from safetensors.torch import load_file, save_file

    from tools.roundtrip import main

    source = make_random_hf_checkpoint(tmp_path / "src", DENSE, dtype="bfloat16", max_shard_size="100KB")
    index = json.loads((source / "model.safetensors.index.json").read_text())
    shard = source / index["weight_map"]["model.embed_tokens.weight"]
    tensors = load_file(str(shard))
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()
    save_file(tensors, str(shard), metadata={"format": "pt"})
    index["weight_map"]["lm_head.weight"] = shard.name
    (source / "model.safetensors.index.json").write_text(json.dumps(index))

    out = tmp_path / "copy"
    with pytest.raises(SystemExit) as exit_info:
        main([str(source), "--out", str(out)])
    printed = capsys.readouterr().out
    assert exit_info.value.code == 0, printed
    assert printed.strip().splitlines()[-1] == "OK"
    assert "acceptable          lm_head.weight" in printed
    report = json.loads((out / "roundtrip.json").read_text())
    assert report["ok"] and report["tied_embeddings"] and report["dtype"] == "bfloat16"
    assert report["acceptable_differences"] == ["lm_head.weight"]
    assert report["missing_keys"] == [] and report["unexpected_keys"] == []
    assert report["max_tensor_diff"] == 0.0
    assert report["max_logit_diff_reloaded"] <= 1e-4 and report["max_logit_diff_titan"] <= 1e-4
    assert (out / "config.json").is_file() and not (out / "sharded").exists()

    # never writes over an existing copy
    with pytest.raises(SystemExit) as exit_info:
        main([str(source), "--out", str(out)])
    assert exit_info.value.code == 2 and "not empty" in capsys.readouterr().err


@pytest.mark.slow
def test_roundtrip_moe(tmp_path):
    from tools.roundtrip import roundtrip

    source = make_random_hf_checkpoint(tmp_path / "src", MOE)
    report = roundtrip(source, tmp_path / "copy")
    assert report.ok, report.render()
    assert report.missing_keys == report.unexpected_keys == report.acceptable_differences == []
    assert report.max_tensor_diff == 0.0 and report.max_logit_diff_reloaded <= 1e-4
    # torchtitan's GroupedExperts runs in bf16: close, not exact
    assert 0 < report.rel_logit_diff_titan < 0.02


def test_roundtrip_key_check_fails_on_anything_but_tied_lm_head():
    from tools.roundtrip import key_differences

    before = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
    assert key_differences(before, before - {"lm_head.weight"}, tied=True) == ([], [], ["lm_head.weight"])
    assert key_differences(before, before - {"lm_head.weight"}, tied=False) == (["lm_head.weight"], [], [])
    missing, unexpected, acceptable = key_differences(
        before, (before - {"model.norm.weight", "lm_head.weight"}) | {"model.extra.weight"}, tied=True
    )
    assert (missing, unexpected, acceptable) == (["model.norm.weight"], ["model.extra.weight"], ["lm_head.weight"])


# --------------------------------------------------------------------------------------------
# The model group means the same architecture in both modes
# --------------------------------------------------------------------------------------------


def _prepared(overrides: list[str]):
    """The prepared run, as mode=plan prepares it (shapes only: no fit check against this host)."""
    from qwen3_trn.run.preflight import prepare

    return prepare(to_run_config(compose_config(["mode=plan", *overrides])))


def _native_hf_shapes(overrides: list[str]) -> tuple[dict, int]:
    """Native model (meta) -> HF names/shapes through torchtitan's own Qwen3 adapter."""
    from torchtitan.models.qwen3.state_dict_adapter import Qwen3StateDictAdapter

    prepared = _prepared(["backend=native", *overrides])
    spec = prepared.trainer_config.model_spec
    with torch.device("meta"):
        model = spec.model.build()
    hf = Qwen3StateDictAdapter(spec.model, None).to_hf(model.state_dict())
    return {k: tuple(v.shape) for k, v in hf.items()}, sum(p.numel() for p in model.parameters())


def _hf_v5_shapes(overrides: list[str]) -> tuple[dict, int, dict]:
    """The model torchtitan's transformers backend builds for backend=hf_v5 (meta), in the
    safetensors layout transformers writes."""
    from qwen3_trn.hf.checkpoint import per_expert_layout

    trainer_config = _prepared(["backend=hf_v5", *overrides]).trainer_config
    model_config = trainer_config.model_spec.model
    model_config.update_from_config(config=trainer_config)
    with torch.device("meta"):
        model = model_config.build()
    hf_model = model.model  # the transformers Qwen3ForCausalLM / Qwen3MoeForCausalLM
    shapes = {k: tuple(v.shape) for k, v in hf_model.state_dict().items()}
    if hf_model.config.tie_word_embeddings:
        assert hf_model.lm_head.weight is hf_model.model.embed_tokens.weight
        shapes.pop("lm_head.weight")
    hf_config = json.loads((Path(trainer_config.hf_model) / "config.json").read_text())
    return per_expert_layout(shapes), sum(p.numel() for p in hf_model.parameters()), hf_config


@pytest.mark.parametrize(
    "overrides",
    [
        ["model=tiny"],
        ["model=tiny", "model.dim=128", "model.hidden_dim=384", "model.n_layers=3", "model.rope_theta=10000"],
        ["model=tiny_moe"],
        ["model=tiny_moe", "model.num_experts=4", "model.top_k=1", "model.moe_hidden_dim=128"],
        ["model=0.6B", "model.n_layers=2"],
        ["model=30B-A3B", "model.n_layers=1"],
    ],
    ids=["tiny", "tiny-overrides", "tiny_moe", "tiny_moe-overrides", "0.6B", "30B-A3B"],
)
def test_model_group_means_the_same_architecture_in_both_modes(overrides):
    native_shapes, native_params = _native_hf_shapes(overrides)
    hf_shapes, hf_params, hf_config = _hf_v5_shapes(overrides)
    assert hf_params == native_params
    assert set(hf_shapes) == set(native_shapes), sorted(set(hf_shapes) ^ set(native_shapes))[:10]
    differ = {k: (native_shapes[k], hf_shapes[k]) for k in native_shapes if native_shapes[k] != hf_shapes[k]}
    assert not differ, differ
    arch = _prepared(["backend=native", *overrides]).arch
    assert hf_config["rope_parameters"]["rope_theta"] == arch.rope_theta
    assert hf_config["tie_word_embeddings"] == arch.tie_embeddings
    if arch.is_moe:
        assert (hf_config["num_experts_per_tok"], hf_config["norm_topk_prob"]) == (arch.top_k, True)


def test_hf_model_local_dir_replaces_the_flavor_and_overrides_apply(tmp_path):
    source = make_random_hf_checkpoint(tmp_path / "src", DENSE, with_tokenizer=False)
    released = _prepared(["backend=hf_v5", "model=0.6B", f"model.hf_model={source}"]).arch
    assert released == dataclasses.replace(DENSE, max_seq_len=256)
    cut = _prepared(["backend=hf_v5", "model=0.6B", f"model.hf_model={source}", "model.n_layers=1"]).arch
    assert cut == dataclasses.replace(released, n_layers=1)


# --------------------------------------------------------------------------------------------
# Clear errors, raised before any worker starts
# --------------------------------------------------------------------------------------------


def _config_error(overrides: list[str], tmp_path: Path) -> ConfigError:
    run_dir = tmp_path / "run"
    with pytest.raises(ConfigError) as info:
        execute(compose_config(overrides, run_dir))
    assert not run_dir.exists(), "nothing may be written before the config is valid"
    return info.value


def test_error_unreachable_hub_id(tmp_path):
    error = _config_error(["backend=hf_v5", "model.hf_model=qwen3-trn-tests/does-not-exist"], tmp_path)
    assert error.key == "model.hf_model"
    assert "not a local directory" in str(error) and "not a reachable hub id" in str(error)
    assert "HF_HUB_OFFLINE" in str(error)


def test_error_missing_local_path(tmp_path):
    error = _config_error(["backend=hf_v5", f"model.hf_model={tmp_path}/no/such/dir"], tmp_path)
    assert error.key == "model.hf_model" and "neither a local directory" in str(error)


def test_error_local_dir_without_config_json(tmp_path):
    (tmp_path / "model").mkdir()
    error = _config_error(["backend=hf_v5", f"model.hf_model={tmp_path / 'model'}"], tmp_path)
    assert error.key == "model.hf_model" and "holds no config.json" in str(error)


def _hf_dir(tmp_path: Path, **changes) -> Path:
    source = make_random_hf_checkpoint(tmp_path / "hf", DENSE, with_tokenizer=False)
    config = json.loads((source / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (source / "config.json").write_text(json.dumps(config))
    return source


def test_error_config_without_architectures(tmp_path):
    error = _config_error(["backend=hf_v5", f"model.hf_model={_hf_dir(tmp_path, architectures=None)}"], tmp_path)
    assert error.key == "model.hf_model"
    assert "no `architectures`" in str(error) and '"architectures": ["Qwen3ForCausalLM"]' in str(error)


def test_error_non_qwen3_architecture(tmp_path):
    source = _hf_dir(tmp_path, architectures=["LlamaForCausalLM"], model_type="llama")
    error = _config_error(["backend=hf_v5", f"model.hf_model={source}"], tmp_path)
    assert error.key == "model.hf_model" and "LlamaForCausalLM" in str(error) and "not Qwen3" in str(error)


def test_error_initial_load_path_without_safetensors(tmp_path):
    folder = tmp_path / "weights"
    folder.mkdir()
    (folder / "pytorch_model.bin").write_bytes(b"")
    error = _config_error(["backend=hf_v5", f"checkpoint.initial_load_path={folder}"], tmp_path)
    assert error.key == "checkpoint.initial_load_path"
    assert "no *.safetensors" in str(error) and "pytorch_model.bin" in str(error)


def test_error_checkpoint_shape_mismatch_names_tensors(tmp_path):
    # weights of a dim-64 model, loaded into model=tiny (dim 256)
    source = make_random_hf_checkpoint(tmp_path / "hf", DENSE, with_tokenizer=False)
    error = _config_error(["backend=hf_v5", f"checkpoint.initial_load_path={source}"], tmp_path)
    assert error.key == "checkpoint.initial_load_path"
    message = str(error)
    assert "shapes differ" in message
    assert "model.embed_tokens.weight: checkpoint [2048, 64] vs model [2048, 256]" in message


def test_error_checkpoint_with_fewer_layers(tmp_path):
    source = make_random_hf_checkpoint(tmp_path / "hf", DENSE, with_tokenizer=False)
    error = _config_error(
        ["backend=hf_v5", "model=0.6B", f"model.hf_model={source}", "model.n_layers=3", f"checkpoint.initial_load_path={source}"],
        tmp_path,
    )
    assert error.key == "checkpoint.initial_load_path" and "model.layers.2." in str(error) and "lacks" in str(error)


@pytest.mark.parametrize(
    "overrides,key,fix",
    [
        (["backend.hf_experts_implementation=eager"], "backend.hf_experts_implementation", "model is dense"),
        (["model=tiny_moe", "backend.hf_experts_implementation=fastest"], "backend.hf_experts_implementation", "grouped_mm"),
        (["launcher.nproc_per_node=2", "parallelism.tp=2"], "parallelism.tp", "parallelism.tp=1"),
        (["model.attention=varlen"], "model.attention", "model.attention=auto"),
    ],
)
def test_backend_option_errors(overrides, key, fix, tmp_path):
    error = _config_error(["backend=hf_v5", *overrides], tmp_path)
    assert error.key == key and fix in str(error)


def test_cli_error_exits_2_before_any_worker(tmp_path, capsys):
    from qwen3_trn.app import run

    run_dir = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_info:
        run(compose_config(["backend=hf_v5", "model.hf_model=qwen3-trn-tests/does-not-exist"], run_dir))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "model.hf_model" in err and "not a reachable hub id" in err
    assert not run_dir.exists()
