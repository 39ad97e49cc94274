"""benchmarks/cuda_suite.py: the GPU cases are real CLI runs that this config accepts (no GPU needed)."""

from __future__ import annotations

import importlib.util
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.commands import command_in_process
from tests.conftest import REPO

SUITE = [sys.executable, str(REPO / "benchmarks" / "cuda_suite.py")]


def _suite(*args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([*SUITE, *args], check=False, cwd=REPO, capture_output=True, text=True, timeout=timeout)


def test_dry_run_prints_one_cli_command_per_case_with_the_gpu_settings(tmp_path):
    result = _suite("--dry-run", "--out", str(tmp_path), "training.steps=50", timeout=60)
    assert result.returncode == 0, result.stderr
    commands = {line.split(": ", 1)[0]: shlex.split(line.split(": ", 1)[1]) for line in result.stdout.splitlines()}
    assert list(commands) == ["native-0.6B", "native-1.7B", "hf_v5-0.6B", "hf_v5-1.7B", "moe-30B-A3B-4L"]
    for name, argv in commands.items():
        assert argv[1:3] == ["-m", "qwen3_trn"], name
        for setting in (
            "device=cuda",
            "parallelism=fsdp",
            "launcher.nproc_per_node=1",
            "compile=inductor",
            "model.attention=flex",
            "training.mixed_precision_param=bfloat16",
            "training.steps=50",
        ):
            assert setting in argv, (name, setting)
        assert argv[-1] == f"hydra.run.dir={tmp_path / name}"
    assert {"backend=nki_moe", "model=30B-A3B", "model.n_layers=4", "backend.kernels=grouped_mm"} <= set(commands["moe-30B-A3B-4L"])
    assert {"backend=hf_v5", "model=1.7B"} <= set(commands["hf_v5-1.7B"])


def test_without_a_gpu_the_suite_refuses_to_run_and_says_what_to_do():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    result = _suite("--cases", "native-0.6B", timeout=120)
    assert result.returncode != 0 and "no CUDA GPU here" in result.stderr and "--dry-run" in result.stderr


def _suite_module():
    spec = importlib.util.spec_from_file_location("cuda_suite", REPO / "benchmarks" / "cuda_suite.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _assert_cuda_plan(run_dir: Path, name: str) -> None:
    """The plan of a CUDA case: inductor and flex attention in its resolved config (the file
    the plan names), the device planned for."""
    config = (run_dir / "config.yaml").read_text()
    assert "compile:\n  backend: inductor" in config and "attention: flex" in config, name
    plan = (run_dir / "plan.txt").read_text()
    assert "device: cuda" in plan and f"resolved config: {run_dir / 'config.yaml'}" in plan, name


@pytest.mark.slow
def test_the_suites_plan_mode_validates_a_case_through_the_cli(tmp_path):
    result = _suite("--plan", "--cases", "moe-30B-A3B-4L", "--out", str(tmp_path), timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    _assert_cuda_plan(tmp_path / "moe-30B-A3B-4L", "moe-30B-A3B-4L")
    assert "kernels: grouped_mm" in (tmp_path / "moe-30B-A3B-4L" / "config.yaml").read_text()


def test_every_case_passes_the_projects_validation_as_a_cuda_plan(tmp_path):
    """Each case's command line, through the command's path in this process, with mode=plan."""
    suite = _suite_module()
    for case in suite.CASES:
        run_dir = tmp_path / case.name
        done = command_in_process(suite.case_overrides(case, ["mode=plan"]), run_dir)
        assert done.returncode == 0, (case.name, done.stderr[-3000:])
        _assert_cuda_plan(run_dir, case.name)
