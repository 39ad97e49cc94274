"""The product on the torchtitan Trainium users have: upstream main of the window AWS's
torchtitan-neuron 0.2.2+neuron.1 is cut from (2026-04-17 to 0.3.0), at the three commits of
``../shared/torchtitan-window/`` (upstream's ``torchtitan`` package, first on PYTHONPATH, as the
archives' README says to use them).

Per snapshot, one interpreter runs the command's entry point several times (one import of
torch and torchtitan): native and nki_moe train with falling loss, hf_v5 is one exit-2
paragraph, and ``mode=plan`` names every feature that is off there and why.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile

import pytest

from qwen3_trn.results.records import read_metrics
from tests.commands import REPO, cli_env

WINDOW = REPO.parent / "shared" / "torchtitan-window"
# commit -> the features that are off on it (upstream added them after that commit;
# qwen3_trn.titan.MAY_BE_OFF)
SNAPSHOTS = {
    "7cec16600": ("chunked loss", "pipeline-parallel planning", "expert parallelism", "backend=hf_v5"),
    "4ed3c5363": ("chunked loss", "backend=hf_v5"),
    "a9c5edc74": ("chunked loss", "backend=hf_v5"),
}

CASES = {
    "native": ["debug=smoke"],
    "nki_moe": ["debug=smoke", "backend=nki_moe", "model=tiny_moe"],
    "hf_v5": ["debug=smoke", "backend=hf_v5"],
    "plan": ["mode=plan", "model=tiny_moe"],
    "expert_parallel": ["mode=plan", "model=tiny_moe", "launcher.nproc_per_node=2", "parallelism.dp_shard=2", "parallelism.ep=2"],
    "export": ["debug=smoke", "checkpoint=hf_export", "checkpoint.enable=true"],
    "trn2": ["mode=plan", "device=neuron", "experiment=trn2_48xlarge", "model=30B-A3B"],
}

# Runs the cases through the command's entry point in one interpreter and prints their results.
DRIVER = """
import json, sys
from tests.conftest import command_in_process
results = {}
for name, args in json.loads(sys.argv[1]).items():
    done = command_in_process(args)
    results[name] = {"returncode": done.returncode, "stdout": done.stdout, "stderr": done.stderr}
print("RESULTS " + json.dumps(results))
"""


@pytest.fixture(scope="module", params=sorted(SNAPSHOTS))
def window_run(request, tmp_path_factory):
    commit = request.param
    archive = WINDOW / f"torchtitan-{commit}.tar.gz"
    if not archive.exists():
        pytest.skip(f"{archive} is not here (the torchtitan window archives live in ../shared)")
    root = tmp_path_factory.mktemp(f"torchtitan-{commit}")
    with tarfile.open(archive) as tar:
        tar.extractall(root / "src", filter="data")
    cases = {name: [*args, f"hydra.run.dir={root / name}"] for name, args in CASES.items()}
    env = cli_env({"PYTHONPATH": f"{root / 'src'}:{REPO}"})
    done = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(cases)], cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULTS ")]
    assert done.returncode == 0 and lines, done.stderr[-5000:]
    return commit, root, json.loads(lines[-1][len("RESULTS ") :])


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["native", "nki_moe"])
def test_trains_with_falling_loss(window_run, mode):
    commit, root, results = window_run
    result = results[mode]
    assert result["returncode"] == 0, result["stderr"][-3000:]
    losses = [record["loss"] for record in read_metrics(root / mode) if "loss" in record]
    assert len(losses) == 3 and losses[-1] < losses[0], (commit, losses)
    assert "Traceback" not in result["stderr"]


@pytest.mark.slow
def test_hf_v5_is_one_paragraph_naming_what_is_missing(window_run):
    commit, root, results = window_run
    result = results["hf_v5"]
    assert result["returncode"] == 2, result["stderr"][-3000:]
    error = result["stderr"].strip()
    assert "Traceback" not in error
    paragraph = error.split("\n(set QWEN3_TRN_TRACEBACK")[0]
    assert paragraph.startswith(f"error: backend: backend=hf_v5 cannot run on torchtitan from {root / 'src'}")
    assert "\n" not in paragraph
    assert "HFTransformerTrainer" in paragraph and "use backend=native" in paragraph
    assert not (root / "hf_v5").exists()


@pytest.mark.slow
def test_plan_says_what_is_off_in_one_line_each(window_run):
    commit, root, results = window_run
    result = results["plan"]
    assert result["returncode"] == 0, result["stderr"][-3000:]
    off = [line for line in result["stdout"].splitlines() if line.startswith("off here: ")]
    assert [line.removeprefix("off here: ").split(":")[0] for line in off] == list(SNAPSHOTS[commit])
    assert f"torchtitan: from {root / 'src'} (no installed distribution)" in result["stdout"]


@pytest.mark.slow
def test_expert_parallel_only_where_this_torchtitan_dispatches_for_it(window_run):
    commit, _root, results = window_run
    result = results["expert_parallel"]
    if "expert parallelism" in SNAPSHOTS[commit]:
        assert result["returncode"] == 2
        assert "error: parallelism.ep: expert parallelism cannot run on torchtitan" in result["stderr"]
    else:
        assert result["returncode"] == 0, result["stderr"][-3000:]
        assert "ep=2" in result["stdout"]


@pytest.mark.slow
def test_the_trn2_plan_measures_activations_on_this_torchtitan(window_run):
    """AWS's layout for 30B-A3B, with the fit probe run on this torchtitan's model (not the closed
    form it falls back to when the probe fails)."""
    _commit, _root, results = window_run
    result = results["trn2"]
    assert result["returncode"] == 0, result["stderr"][-3000:]
    assert "dp_shard=16, cp=1, tp=4, pp=1, ep=1" in result["stdout"]
    assert "estimate (composed)" in result["stdout"]


@pytest.mark.slow
def test_checkpoints_and_the_hf_export_are_written(window_run):
    """The project's checkpoint manager hooks this torchtitan's save (``save`` itself before
    ``_save`` existed): the DCP step and the Hugging Face export both land."""
    _commit, root, results = window_run
    assert results["export"]["returncode"] == 0, results["export"]["stderr"][-3000:]
    assert (root / "export" / "checkpoint" / "step-3" / ".metadata").is_file()
    assert sorted(path.name for path in (root / "export" / "hf" / "step-3").glob("*.safetensors"))
    assert (root / "export" / "hf" / "step-3" / "config.json").is_file()
