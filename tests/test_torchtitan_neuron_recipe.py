"""``backend.kernels=torchtitan_neuron``: the model of torchtitan-neuron's own NKI MoE recipe,
``qwen3_nki_moe_config``, chosen by name (``kernels=auto`` follows AWS's Neuron 2.34 recipes to
torch._grouped_mm instead).

torchtitan-neuron cannot be installed here (its PyPI name is a placeholder) and its source was not
found, so a stand-in package in the test's tmp dir provides
``torchtitan_neuron.models.qwen3.config_registry.qwen3_nki_moe_config``. It follows the seed
article's call (/work/shared/seed/, third recipe: ``qwen3_nki_moe_config("30B-A3B",
compile_config=CompileConfig(enable=False, backend="neuron"), n_layers=4, num_experts=64,
top_k=4)`` returning a ``Trainer.Config``) and builds its model from upstream torchtitan's Qwen3 MoE
pieces (``model_registry`` and ``_build_qwen3_moe_layers`` of ``torchtitan.models.qwen3``), with
SDPA attention as torchtitan-neuron's fork still accepts (``attn_backend="sdpa"``). Each call is
appended, with the calling process, to the file named by ``STAND_IN_CALLS``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from qwen3_trn.backends import build_backend
from qwen3_trn.common.errors import ConfigError
from qwen3_trn.config.typed import to_run_config
from qwen3_trn.devices import planned_device
from qwen3_trn.models import torchtitan_neuron
from qwen3_trn.results.records import read_manifest
from tests.commands import command_in_process
from tests.conftest import compose_config

RECIPE = '''
"""Stand-in for torchtitan_neuron/models/qwen3/config_registry.py of aws-neuron/torchtitan-neuron
(source not found): the seed article's qwen3_nki_moe_config, built from upstream torchtitan's Qwen3 MoE pieces."""
import dataclasses
import json
import os

from torchtitan.config import CompileConfig
from torchtitan.models.common.attention import ScaledDotProductAttention
from torchtitan.models.qwen3 import _build_qwen3_moe_layers, model_registry
from torchtitan.trainer import Trainer


def qwen3_nki_moe_config({parameters}) -> Trainer.Config:
    with open(os.environ["STAND_IN_CALLS"], "a") as calls:
        compile_config = dataclasses.asdict(compile_config)
        calls.write(json.dumps(dict(pid=os.getpid(), flavor=flavor, compile_config=compile_config,
                                    n_layers=n_layers, num_experts=num_experts, top_k=top_k)) + "\\n")
    spec = model_registry(flavor, attn_backend="flex")
    model = spec.model
    attention = model.layers[0].attention
    model.layers = _build_qwen3_moe_layers(
        n_layers=n_layers, dim=model.dim, n_heads=attention.n_heads, n_kv_heads=attention.n_kv_heads,
        head_dim=attention.head_dim, moe_hidden_dim=model.layers[0].moe.routed_experts.inner_experts.hidden_dim,
        num_experts=num_experts, top_k=top_k, attn_backend="flex", moe_comm_backend="standard", rope=attention.rope,
    )
    for layer in model.layers:
        layer.attention.inner_attention = ScaledDotProductAttention.Config()
    return Trainer.Config(model_spec=spec, compile=CompileConfig(**compile_config))
'''
# The article's call: the flavor by position, the rest by keyword.
ARTICLE_SIGNATURE = "flavor, *, compile_config, n_layers=48, num_experts=128, top_k=8"
SEED_COMMAND = [
    "backend=nki_moe",
    "backend.kernels=torchtitan_neuron",
    "device=neuron",
    "model=30B-A3B",
    "model.n_layers=4",
    "model.num_experts=64",
    "model.top_k=4",
]
SEED_CALL = {
    "flavor": "30B-A3B",
    "compile_config": {"enable": False, "enable_async_tensor_parallel": False, "components": ["model", "loss"], "backend": "neuron"},
    "n_layers": 4,
    "num_experts": 64,
    "top_k": 4,
}


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    """``stand_in(parameters)``: torchtitan_neuron importable here and in the processes a command
    starts, its recipe taking ``parameters``; returns the file its calls are recorded in."""

    def forget() -> None:
        for name in [name for name in sys.modules if name.split(".")[0] == "torchtitan_neuron"]:
            del sys.modules[name]

    def install(parameters: str = ARTICLE_SIGNATURE) -> Path:
        root = tmp_path / "site"
        package = root / "torchtitan_neuron" / "models" / "qwen3"
        package.mkdir(parents=True)
        for folder in (package, package.parent, package.parent.parent):
            (folder / "__init__.py").write_text("")
        (package / "config_registry.py").write_text(RECIPE.format(parameters=parameters))
        calls = tmp_path / "calls.jsonl"
        monkeypatch.syspath_prepend(str(root))
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])))
        monkeypatch.setenv("STAND_IN_CALLS", str(calls))
        forget()
        return calls

    yield install
    forget()


@pytest.mark.slow
def test_check_builds_rank_0_from_the_recipe_called_with_the_seed_arguments(stand_in, run_dir):
    calls = stand_in()
    done = command_in_process([*SEED_COMMAND, "mode=check"], run_dir)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "kernel: torchtitan_neuron\nkernels_requested: torchtitan_neuron" in done.stdout
    # every process starts from a config that names the recipe
    assert "  kernels: torchtitan_neuron" in (run_dir / "config.yaml").read_text()
    recorded = [json.loads(line) for line in calls.read_text().splitlines()]
    seed_calls = [call for call in recorded if {k: v for k, v in call.items() if k != "pid"} == SEED_CALL]
    # planned here, then rank 0 built from it in the fake-backend check's own process
    assert os.getpid() in {call["pid"] for call in seed_calls} and {call["pid"] for call in seed_calls} - {os.getpid()}, recorded
    # the memory tracker's shallower builds of rank 0 differ only in depth
    assert all({**call, "n_layers": 4, "pid": 0} == {**SEED_CALL, "pid": 0} for call in recorded), recorded
    check = json.loads(done.stdout.split("== Fake-backend check ==")[1].strip().splitlines()[0])
    assert check["parameters"] == json.loads((run_dir / "plan.json").read_text())["fit"]["parameters"]["total"]


def test_a_recipe_with_another_signature_is_refused(stand_in, run_dir):
    stand_in("flavor, *, compile_config, n_layers, num_experts, experts_per_token")
    done = command_in_process([*SEED_COMMAND, "mode=plan"], run_dir)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "backend.kernels: kernels=torchtitan_neuron cannot run:" in done.stderr
    assert "qwen3_nki_moe_config(flavor, *, compile_config, n_layers, num_experts, experts_per_token)" in done.stderr
    assert "it takes no keyword parameter 'top_k'; it requires 'experts_per_token'" in done.stderr


def backend_and_run(overrides: list[str], tmp_path: Path):
    cfg = to_run_config(compose_config(["backend=nki_moe", "model=30B-A3B", *overrides], tmp_path / "run"))
    return build_backend(cfg.backend), cfg


def test_auto_keeps_aws_measured_grouped_mm_where_the_recipe_imports(stand_in, tmp_path):
    """AWS's Neuron 2.34 MoE recipes left the blockwise NKI kernels for torch._grouped_mm."""
    stand_in()
    backend, cfg = backend_and_run([], tmp_path)
    neuron = planned_device("neuron")
    assert not backend.uses_recipe() and backend.kernel_name(neuron) == "grouped_mm"
    explicit, cfg = backend_and_run(["backend.kernels=torchtitan_neuron"], tmp_path)
    assert explicit.uses_recipe() and explicit.kernel_name(neuron) == "torchtitan_neuron"
    with pytest.raises(ConfigError, match="its model runs NKI kernels, on neuron, not cpu"):
        explicit.validate(cfg, explicit.architecture(cfg), planned_device("cpu"))


def test_the_recipe_must_build_the_model_the_project_describes(stand_in, tmp_path, monkeypatch):
    stand_in()
    backend, cfg = backend_and_run(
        ["backend.kernels=torchtitan_neuron", "model.n_layers=4", "model.num_experts=64", "model.top_k=4"], tmp_path
    )
    arch = backend.architecture(cfg)
    assert len(backend.model_spec(cfg, arch, planned_device("neuron")).model.layers) == 4
    aws = torchtitan_neuron.recipe()

    def ignoring_top_k(flavor, *, compile_config, n_layers, num_experts, top_k):
        return aws(flavor, compile_config=compile_config, n_layers=n_layers, num_experts=num_experts, top_k=8)

    monkeypatch.setattr(torchtitan_neuron, "recipe", lambda: ignoring_top_k)
    with pytest.raises(ConfigError, match=r"builds a model with top_k=8 \(the project's 4\)"):
        backend.model_spec(cfg, arch, planned_device("neuron"))


def test_a_sweep_over_top_k_and_n_layers_calls_the_recipe_with_each(stand_in, tmp_path):
    calls = stand_in()
    sweep = [*SEED_COMMAND[:4], "model.num_experts=64", "model.n_layers=2,4", "model.top_k=2,4"]
    done = command_in_process(["-m", *sweep, "mode=plan", f"hydra.sweep.dir={tmp_path / 'sweep'}"])
    assert done.returncode == 0, done.stderr[-3000:]
    jobs = read_manifest(tmp_path / "sweep")["jobs"]
    assert [job["status"] for job in jobs] == ["planned"] * 4, jobs
    recorded = {(call["n_layers"], call["top_k"]) for call in map(json.loads, calls.read_text().splitlines())}
    assert recorded == {(2, 2), (2, 4), (4, 2), (4, 4)}
