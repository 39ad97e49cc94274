"""Neuron's compile options and the NEFF cache every rank shares (qwen3_trn/devices/neuron.py).

torch-neuronx's torch.compile reference (AWS Neuron docs, "torch.compile backend reference"):
``dynamic=True`` is rejected during compilation, ``fullgraph=True`` is recommended; compiled
programs are cached in ``TORCH_NEURONX_NEFF_CACHE_DIR``. The compile options are checked here on
torch.compile itself (backend ``eager``: the Neuron backend is not here).
"""

from __future__ import annotations

import re
import sys
import types

import pytest
import torch
import torch._dynamo

from qwen3_trn import devices
from qwen3_trn.devices import neuron
from qwen3_trn.results.records import read_manifest
from tests.commands import command_in_process


@pytest.fixture
def neuron_compile(monkeypatch):
    """torch.compile as a Neuron rank has it after the device's ``activate`` (restored afterwards);
    torch-neuronx, which it imports, stood in by an empty module (its import registers the device)."""
    monkeypatch.setattr(torch, "compile", torch.compile)
    monkeypatch.setitem(sys.modules, "torch_neuronx", types.ModuleType("torch_neuronx"))
    neuron.activate()
    neuron.activate()  # once per process or more: still one wrapper
    assert torch.compile.__wrapped__.__module__ == "torch"
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_a_graph_break_fails_as_with_fullgraph(neuron_compile):
    def breaks(x):
        torch._dynamo.graph_break()
        return x + 1

    compiled = torch.compile(breaks, backend="eager")  # torchtitan's loss asks for neither option
    with pytest.raises(torch._dynamo.exc.Unsupported):
        compiled(torch.ones(2))


def test_dynamic_true_is_never_asked_for(neuron_compile):
    graphs = []

    def recording(graph, example_inputs):
        graphs.append([tuple(t.shape) for t in example_inputs])
        return graph.forward

    module = torch.nn.Linear(4, 4)
    module.compile(backend=recording, dynamic=True)  # as nn.Module.compile passes it on
    for rows in (2, 3, 5):
        module(torch.ones(rows, 4))
    # one static graph per shape, as Neuron recompiles per new shape; no symbolic sizes
    assert [shapes[-1] for shapes in graphs] == [(2, 4), (3, 4), (5, 4)]
    assert all(isinstance(size, int) for shapes in graphs for shape in shapes for size in shape)


def test_plan_puts_the_neff_cache_under_the_run_dir_for_every_rank(run_dir):
    args = ["mode=plan", "device=neuron", "experiment=trn2_48xlarge", "model=8B", f"hydra.run.dir={run_dir}"]
    result = command_in_process(args)
    assert result.returncode == 0, result.stderr[-3000:]
    cache = f"TORCH_NEURONX_NEFF_CACHE_DIR={run_dir}/neff_cache"
    assert f"{cache} NEURON_LOGICAL_NC_CONFIG=2 torchrun" in result.stdout
    assert f"TORCH_NEURONX_NEFF_CACHE_DIR: {run_dir}/neff_cache" in (run_dir / "config.yaml").read_text()


def test_a_sweep_shares_one_neff_cache_and_a_given_one_is_kept(tmp_path):
    sweep = tmp_path / "sweep"
    args = ["-m", "mode=plan", "device=neuron", "experiment=trn2_48xlarge", "model=8B", "training.seq_len=128,256"]
    result = command_in_process([*args, f"hydra.sweep.dir={sweep}"])
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = read_manifest(sweep)["jobs"]
    assert len(jobs) == 2 and all(f"TORCH_NEURONX_NEFF_CACHE_DIR={sweep}/neff_cache " in job["plan"]["submission"] for job in jobs)
    given = ["mode=plan", "device=neuron", "+launcher.env.TORCH_NEURONX_NEFF_CACHE_DIR=/fsx/neff", f"hydra.run.dir={tmp_path / 'run'}"]
    assert "TORCH_NEURONX_NEFF_CACHE_DIR: /fsx/neff" in _config_after(given, tmp_path / "run")


def _config_after(args, run_dir):
    result = command_in_process(args)
    assert result.returncode == 0, result.stderr[-3000:]
    return (run_dir / "config.yaml").read_text()


def test_every_rank_of_a_job_gets_the_shared_cache_in_its_environment(tmp_path, monkeypatch):
    """A real two-rank job (CPU ranks standing for NeuronCores): each rank logs its environment."""
    monkeypatch.setitem(devices.SHARED_RANK_ENV, "cpu", neuron.neff_cache_env)
    run_dir = tmp_path / "run"
    args = ["launcher.nproc_per_node=2", "logger=none", "validation.enable=false", "training.steps=1", "training.seq_len=32"]
    result = command_in_process([*args, "optimizer.warmup_steps=1"], run_dir)
    assert result.returncode == 0, result.stderr[-3000:]
    for rank in (0, 1):
        placement = (run_dir / "logs" / f"rank{rank}.log").read_text()
        assert re.search(rf"launcher.env here: .*TORCH_NEURONX_NEFF_CACHE_DIR={re.escape(str(run_dir))}/neff_cache", placement), placement
