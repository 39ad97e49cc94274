"""checkpoint=hf_export from every mode: a few real training steps, then the folder is loaded as a
user loads it (AutoModelForCausalLM / AutoTokenizer.from_pretrained, generate) and its logits are
compared with torchtitan's own model loaded from the run's DCP checkpoint of the same step.

Tolerances (qwen3_trn.verify): dense models, largest absolute logit difference <= 1e-4 (fp32
on both sides; measured 0 here). MoE models, relative difference <= 1e-2 against torchtitan's
model with its load-balancing expert_bias left out (torchtitan runs experts in bf16; measured
6e-4 to 1e-3); the export cannot hold that bias, and the difference to the model as trained is
reported beside it.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hydra.errors import ConfigCompositionException

from qwen3_trn.app import execute
from qwen3_trn.common.errors import ConfigError
from qwen3_trn.hf.checkpoint import checkpoint_shapes, expected_shapes
from qwen3_trn.results.records import read_summary
from qwen3_trn.verify import verify_export
from tests.commands import command_in_process
from tests.conftest import (
    HF_EXPORT_STEPS,
    HF_EXPORT_TRAINING,
    HF_V5_DENSE,
    NATIVE_DENSE,
    REPO,
    assert_trained,
    compose_config,
    hf_export_run,
)
from tests.hf_checkpoints import read_config

pytestmark = pytest.mark.slow

MODES = [
    # (overrides, architecture, tied embeddings)
    (NATIVE_DENSE, "Qwen3ForCausalLM", True),
    (["backend=native", "model=tiny_moe"], "Qwen3MoeForCausalLM", False),
    (["backend=nki_moe"], "Qwen3MoeForCausalLM", False),
    (HF_V5_DENSE, "Qwen3ForCausalLM", True),
]


@pytest.mark.parametrize("overrides,architecture,tied", MODES, ids=["native-dense", "native-moe", "nki_moe", "hf_v5-dense"])
def test_hf_export_loads_generates_and_matches_torchtitan(overrides, architecture, tied, shared_run):
    # the mode's shared run (tests/test_hf_v5.py reads the dense ones too); DCP checkpoints as
    # well (checkpoint.enable): the comparison loads the trained model into torchtitan
    run = hf_export_run(shared_run, overrides)
    run_dir, result = run.run_dir, run.result
    assert_trained(result, run_dir, steps=HF_EXPORT_STEPS)
    export = run_dir / "hf" / f"step-{HF_EXPORT_STEPS}"
    summary = read_summary(run_dir)
    assert summary["hf_export"] == str(export) and f"Hugging Face model: {export}" in result.stdout

    # a complete folder, written whole (no staging folder or per-rank shards left behind)
    names = {p.name for p in export.iterdir()}
    assert {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"} <= names
    assert any(name.endswith(".safetensors") for name in names) and "sharded" not in names
    assert not list(export.parent.glob(".*"))
    config = read_config(export)
    assert config["architectures"] == [architecture] and config["dtype"] == "float32"
    assert config["tie_word_embeddings"] is tied
    assert config["num_hidden_layers"] == summary["architecture"]["n_layers"] and config["hidden_size"] == summary["architecture"]["dim"]
    generation = json.loads((export / "generation_config.json").read_text())
    assert generation["eos_token_id"] == config["eos_token_id"] is not None

    # exactly the tensors transformers' model has, in its layout (a tied lm_head is not stored)
    stored = checkpoint_shapes(export)
    assert {key: shape for key, (shape, _) in stored.items()} == expected_shapes(config)
    assert {dtype for _, dtype in stored.values()} == {"F32"}
    assert ("lm_head.weight" in stored) is not tied

    report = verify_export(run_dir)
    print(report.render())
    assert report.ok, report.render()
    assert report.model_class == architecture and report.tokenizer_class
    assert report.loading["missing_keys"] == [] and report.loading["unexpected_keys"] == []
    assert report.generated_tokens == 8
    if architecture == "Qwen3MoeForCausalLM":
        assert report.rel_logit_diff <= 1e-2
        assert report.max_expert_bias > 0  # torchtitan's load balancing moved it; the export leaves it out
    else:
        assert report.max_logit_diff <= 1e-4

    if "checkpoint.hf_interval=2" in overrides:  # also exported at step 2, a folder of its own
        assert read_config(run_dir / "hf" / "step-2")["architectures"] == [architecture]
        assert sorted(p.name for p in (run_dir / "hf").iterdir() if p.is_dir()) == ["step-2", f"step-{HF_EXPORT_STEPS}"]


def test_bfloat16_export_without_checkpoints(tmp_path):
    """checkpoint=hf_export alone writes no DCP checkpoint; export_dtype sets the stored dtype."""
    run_dir = tmp_path / "run"
    result = command_in_process(["checkpoint=hf_export", "checkpoint.export_dtype=bfloat16", *HF_EXPORT_TRAINING], run_dir)
    assert_trained(result, run_dir, steps=HF_EXPORT_STEPS)
    export = run_dir / "hf" / f"step-{HF_EXPORT_STEPS}"
    assert not (run_dir / "checkpoint").exists()
    assert read_config(export)["dtype"] == "bfloat16"
    assert {dtype for _, dtype in checkpoint_shapes(export).values()} == {"BF16"}
    with pytest.raises(ConfigError, match="holds no DCP checkpoint"):
        verify_export(run_dir)


def test_export_keys_are_refused_before_any_worker(tmp_path):
    with pytest.raises(ConfigError) as info:
        execute(compose_config(["checkpoint=hf_export", "checkpoint.hf_interval=-1"], tmp_path / "run"))
    assert info.value.key == "checkpoint.hf_interval"
    # a dtype is a choice of the schema: refused as the config is composed
    with pytest.raises(ConfigCompositionException) as composed:
        compose_config(["checkpoint=hf_export", "checkpoint.export_dtype=float8"], tmp_path / "run")
    assert "checkpoint.export_dtype" in str(composed.value.__cause__) and "float32, bfloat16" in str(composed.value.__cause__)
    assert not (tmp_path / "run").exists()


def test_verify_command_line(tmp_path):
    """python -m qwen3_trn.verify on a run without an export: a clear error, exit 2."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(f"output_dir: {run_dir}\nmodel:\n  flavor: debugmodel\n")  # a run that was never trained
    done = subprocess.run([sys.executable, "-m", "qwen3_trn.verify", str(run_dir)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "no Hugging Face export found" in done.stderr


@pytest.mark.parametrize(
    "overrides,tied",
    [(["model=tiny", "model.tie_embeddings=false"], False), (["model=tiny_moe", "model.tie_embeddings=true"], True)],
    ids=["dense-untied", "moe-tied"],
)
def test_tie_embeddings_override_reaches_the_export(overrides, tied, tmp_path):
    """model.tie_embeddings flips the flavor's tying: the exported config.json says so, the stored
    tensors follow, and transformers' model loaded from the folder matches torchtitan's."""
    run_dir = tmp_path / "run"
    result = command_in_process(["checkpoint=hf_export", "checkpoint.enable=true", *overrides, *HF_EXPORT_TRAINING], run_dir)
    assert_trained(result, run_dir, steps=HF_EXPORT_STEPS)
    export = run_dir / "hf" / f"step-{HF_EXPORT_STEPS}"
    assert read_config(export)["tie_word_embeddings"] is tied
    assert ("lm_head.weight" in checkpoint_shapes(export)) is not tied
    report = verify_export(run_dir)
    assert report.ok, report.render()
    assert report.loading["missing_keys"] == [] and report.loading["unexpected_keys"] == []


def test_the_reference_side_loads_no_torchtitan():
    """verify's fresh interpreter runs ``qwen3_trn.hf.reference``: transformers' own models, with
    nothing of torchtitan (whose HF backend patches transformers) or of the trainer imported."""
    code = "import sys, qwen3_trn.hf.reference; print(sorted(m for m in ('torchtitan', 'qwen3_trn.titan', 'transformers') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[]"
