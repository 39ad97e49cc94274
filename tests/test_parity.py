"""``python -m qwen3_trn.compare``: the modes train the same model, and a wrong one is caught."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from qwen3_trn.compare import PARITY_JSON, PARITY_MD, Pair, compare_losses, main
from qwen3_trn.results.records import read_summary
from tests.commands import cli_env, entry_point_in_process
from tests.conftest import REPO, offline_wandb_files, read_offline_wandb_run

SMOKE = ["debug=smoke", "validation=off"]


def parity_command(args: list[str], out: Path) -> subprocess.CompletedProcess:
    """The command as a user runs it, in its own process."""
    cmd = [sys.executable, "-m", "qwen3_trn.compare", *args, "--out", str(out)]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900, env=cli_env())


def parity_in_process(args: list[str], out: Path) -> subprocess.CompletedProcess:
    """The command through its ``main`` in this process (its modes' runs are processes of their
    own either way): the dense fixture runs it as a process once."""
    return entry_point_in_process(main, ["qwen3_trn.compare", *args, "--out", str(out)])


def read_parity(out: Path) -> dict:
    return json.loads((out / PARITY_JSON).read_text())


@pytest.fixture(scope="module")
def dense(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess, Path]:
    """tiny from the native init, every run logging to wandb offline."""
    out = tmp_path_factory.mktemp("parity") / "dense"
    return parity_command(["model=tiny", *SMOKE, "logger=wandb"], out), out


@pytest.fixture(scope="module")
def moe(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path_factory.mktemp("parity") / "moe"
    return parity_in_process(["model=tiny_moe", *SMOKE], out), out


def test_dense_modes_agree_and_the_result_is_recorded(dense):
    done, out = dense
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    parity = read_parity(out)
    assert parity["modes"] == ["native", "hf_v5"]
    assert [p["mode"] for p in parity["pairs"]] == ["hf_v5"]
    pair = parity["pairs"][0]
    native, hf = parity["losses"]["native"], parity["losses"]["hf_v5"]
    assert list(native) == ["1", "2", "3"] and list(hf) == list(native)
    largest = max(abs(hf[s] - native[s]) for s in native)
    assert pair["largest_diff"] == pytest.approx(largest) and 0 < largest <= pair["tolerance"]
    assert pair["expected"].startswith("within tolerance")
    # Both modes started from the native init, exported once: the same first loss to bf16 noise.
    assert parity["initial_weights"] == str(out / "init" / "hf" / "step-1")
    assert abs(native["1"] - hf["1"]) < 1e-2
    assert "parity: every mode agrees with native" in done.stdout
    assert (out / PARITY_MD).read_text().count("hf_v5") >= 2
    # One wandb group: each mode's run and the parity result.
    runs = [read_offline_wandb_run(path) for path in offline_wandb_files(out)]
    assert [r.job_type for r in runs] == ["parity"] and runs[0].group == parity["group"]
    assert runs[0].summary["agrees"] is True
    for mode in ("native", "hf_v5"):
        (path,) = offline_wandb_files(Path(parity["run_dirs"][mode]))
        assert read_offline_wandb_run(path).group == parity["group"]


def test_moe_modes_agree_and_grouped_mm_is_bitwise(moe):
    done, out = moe
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    parity = read_parity(out)
    assert parity["modes"] == ["native", "hf_v5", "nki_moe/grouped_mm", "nki_moe/padded_bmm"]
    pairs = {p["mode"]: p for p in parity["pairs"]}
    if parity["compute_dtype"] == "bfloat16":  # torchtitan's own expert math through the project's kernel
        assert pairs["nki_moe/grouped_mm"]["expected"].startswith("bitwise")
        assert parity["losses"]["nki_moe/grouped_mm"] == parity["losses"]["native"]
        assert pairs["nki_moe/grouped_mm"]["tolerance"] == 0.0
    for mode in ("hf_v5", "nki_moe/padded_bmm"):
        assert pairs[mode]["expected"].startswith("within tolerance") and pairs[mode]["tolerance"] > 0
    summary = read_summary(Path(parity["run_dirs"]["nki_moe/padded_bmm"]))
    assert summary["kernel"] == "padded_bmm"


def perturbed_copy(source: Path, target: Path) -> Path:
    """The checkpoint with one layer's weights moved by noise half their size."""
    shutil.copytree(source, target)
    generator = torch.Generator().manual_seed(0)
    for path in target.glob("*.safetensors"):
        tensors = load_file(path)
        for name, tensor in tensors.items():
            if name.startswith("model.layers.1.") and tensor.dim() == 2:
                tensors[name] = tensor + 0.5 * tensor.std() * torch.randn(tensor.shape, generator=generator)
        save_file(tensors, path, metadata={"format": "pt"})
    return target


def test_a_mode_with_one_layer_perturbed_is_named_with_the_step_it_parts_at(dense, tmp_path):
    """Loaded from an HF checkpoint; hf_v5 alone gets one with a perturbed layer: exit 1, naming the step."""
    _, dense_out = dense
    weights = dense_out / "init" / "hf" / "step-1"
    perturbed = perturbed_copy(weights, tmp_path / "perturbed")
    # fp32 compute: the tightest tolerance, as a user looking for a wrong mode would run it
    fp32 = "training.mixed_precision_param=float32"
    args = ["model=tiny", *SMOKE, fp32, f"checkpoint.initial_load_path={weights}", f"--with=hf_v5:checkpoint.initial_load_path={perturbed}"]
    done = parity_in_process(args, tmp_path / "out")
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    parity = read_parity(tmp_path / "out")
    (pair,) = parity["pairs"]
    native, hf = parity["losses"]["native"], parity["losses"]["hf_v5"]
    first = next(int(step) for step in native if abs(hf[step] - native[step]) > pair["tolerance"])
    assert pair["mode"] == "hf_v5" and pair["parts_at"] == first
    assert f"parity: modes part from native: hf_v5 at step {first}" in done.stdout
    assert "init" not in [p.name for p in (tmp_path / "out").iterdir()]  # the given weights, no init run


def test_two_ranks_under_fsdp_agree(dense, tmp_path):
    _, dense_out = dense
    weights = dense_out / "init" / "hf" / "step-1"
    fsdp = ["launcher.nproc_per_node=2", "parallelism.dp_shard=2"]
    done = parity_in_process(["model=tiny", *SMOKE, *fsdp, f"checkpoint.initial_load_path={weights}"], tmp_path / "out")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    parity = read_parity(tmp_path / "out")
    for mode in ("native", "hf_v5"):
        assert read_summary(Path(parity["run_dirs"][mode]))["world_size"] == 2


@pytest.mark.parametrize(
    "args, named",
    [
        (["backend=hf_v5"], "backend: the parity command sets it per mode"),
        (["--modes", "tensorrt"], "--modes: unknown mode 'tensorrt'"),
        (["--with", "hf_v5"], "--with: 'hf_v5' is not MODE:KEY=VALUE"),
        (["checkpoint.initial_load_path=/nonexistent"], "checkpoint.initial_load_path: '/nonexistent' is not a Hugging Face model folder"),
    ],
)
def test_a_bad_command_exits_2_naming_the_key(args, named, tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:
        main([*args, "--out", str(tmp_path / "out")])
    assert exited.value.code == 2
    assert named in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # nothing ran


def test_a_config_the_runs_refuse_exits_2_before_any_run(tmp_path, capsys):
    """Through the command's ``main`` in this process (as its own process: the fixtures above):
    every problem the runs would refuse, at once, and nothing trained (not even the init run)."""
    with pytest.raises(SystemExit) as exited:
        main(["training.steps=0", "optimizer.lr=-1", "training.stpes=1", "--out", str(tmp_path / "out")])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "training.steps: must be >= 1" in err and "optimizer.lr: must be >= 0" in err and "did you mean steps" in err, err
    assert not (tmp_path / "out").exists()


def test_a_mode_that_logged_other_steps_or_nan_does_not_agree():
    reference = {1: 7.0, 2: 6.9, 3: 6.8}
    short = compare_losses(reference, {1: 7.0, 2: 6.9}, Pair("hf_v5", "within tolerance", 1.0))
    assert not short.agrees and "logged steps [1, 2]" in short.error
    nan = compare_losses(reference, {1: 7.0, 2: float("nan"), 3: 6.8}, Pair("hf_v5", "within tolerance", 1.0))
    assert not nan.agrees and nan.parts_at == 2
