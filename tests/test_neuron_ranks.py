"""A packed Neuron job's ranks each see one NeuronCore of the job's slice.

torch-neuronx's process group (aws-neuron's torch-neuronx source, public mirror
parmoham-aws/test-repo-parmoham, ``torch_neuronx/distributed/backend.py``: ``_set_rt_visible_cores``
and ``_neuron_runtime_setup``) sets ``NEURON_RT_VISIBLE_CORES=LOCAL_RANK`` only where the variable
is unset, starts the runtime on the cores it lists and asserts ``_vnc_count() == 1``: "Attempted to
have more than one device per process in distributed setup". Device packing hands a job its slice
as ``NEURON_RT_VISIBLE_CORES=a,b,...``; each rank must narrow it to its own core.
"""

from __future__ import annotations

import json
import os

import pytest

from qwen3_trn import devices
from qwen3_trn.devices import DeviceSpec, confine_rank_to_its_device
from qwen3_trn.launch import packing
from tests.conftest import in_process

# Imported first by every interpreter the elastic agent starts (PYTHONPATH): the process-group
# setup of torch_neuronx/distributed/backend.py, run where torch-neuronx runs it (when the
# process group is created), recording what each rank saw.
NEURON_PROCESS_GROUP_STANDIN = """
import json, os
import torch.distributed as dist

_init_process_group = dist.init_process_group


def _visible_cores(value):
    cores = []
    for part in value.split(","):
        first, _, last = part.partition("-")
        cores += list(range(int(first), int(last) + 1)) if last else [int(first)]
    return cores


def init_process_group(*args, **kwargs):
    # _set_rt_visible_cores: LOCAL_RANK only when the user has not set the variable.
    if not os.environ.get("NEURON_RT_VISIBLE_CORES"):
        os.environ["NEURON_RT_VISIBLE_CORES"] = os.environ["LOCAL_RANK"]
    cores = _visible_cores(os.environ["NEURON_RT_VISIBLE_CORES"])
    record = os.path.join(os.environ["NEURON_STANDIN_RECORDS"], "rank" + os.environ["RANK"] + ".json")
    with open(record, "w") as f:
        json.dump({"local_rank": int(os.environ["LOCAL_RANK"]), "cores": cores}, f)
    # _neuron_runtime_setup, after nrt_init on the visible cores:
    assert len(cores) == 1, "Attempted to have more than one device per process in distributed setup"
    return _init_process_group(*args, **kwargs)


dist.init_process_group = init_process_group
"""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="packs a job onto two cores of this machine")
def test_each_rank_of_a_packed_job_gets_its_own_core_of_the_slice(tmp_path, monkeypatch):
    """A real two-rank job through the local launcher with device packing; the machine's two
    packable slots stand for NeuronCores (the slice reaches the ranks through the Neuron binder)."""
    standin = tmp_path / "standin"
    standin.mkdir()
    (standin / "sitecustomize.py").write_text(NEURON_PROCESS_GROUP_STANDIN)
    records = tmp_path / "records"
    records.mkdir()
    bind_cpu = packing.SLICE_BINDERS["cpu"]
    monkeypatch.setitem(packing.SLICE_BINDERS, "cpu", lambda slots: {**bind_cpu(slots), **packing.SLICE_BINDERS["neuron"](slots)})
    run_dir = tmp_path / "run"
    env = {
        "PYTHONPATH": os.pathsep.join([str(standin), os.environ.get("PYTHONPATH", "")]),
        "NEURON_STANDIN_RECORDS": str(records),
        "QWEN3_TRN_SLOTS_DIR": str(tmp_path / "slots"),
    }
    args = ["launcher.nproc_per_node=2", "launcher.devices_per_job=2", "logger=none", "validation.enable=false"]
    result = in_process([*args, "training.steps=1", "training.seq_len=32", "optimizer.warmup_steps=1"], run_dir, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = [json.loads(path.read_text()) for path in sorted(records.glob("rank*.json"))]
    slice_ = json.loads((run_dir / "device_slice.json").read_text())["slots"]
    assert len(seen) == 2 and len(slice_) == 2
    assert all(len(rank["cores"]) == 1 for rank in seen)
    assert sorted(rank["cores"][0] for rank in seen) == sorted(slice_)  # distinct, within the slice
    assert all(rank["cores"] == [slice_[rank["local_rank"]]] for rank in seen)


@pytest.mark.parametrize(
    ("visible", "local_rank", "expected"),
    [("8,9,10,11", "2", "10"), ("8-11", "3", "11"), ("5", "0", "5")],
)
def test_a_rank_keeps_its_own_core_and_gets_the_slice_back(visible, local_rank, expected):
    environ = {"NEURON_RT_VISIBLE_CORES": visible, "LOCAL_RANK": local_rank}
    with confine_rank_to_its_device(environ):
        assert environ["NEURON_RT_VISIBLE_CORES"] == expected
    assert environ["NEURON_RT_VISIBLE_CORES"] == visible


def test_a_rank_beyond_the_slice_is_told_why():
    environ = {"NEURON_RT_VISIBLE_CORES": "8,9", "LOCAL_RANK": "2"}
    with pytest.raises(RuntimeError, match="launcher.nproc_per_node"):
        with confine_rank_to_its_device(environ):
            pass


def test_ranks_without_the_variable_are_left_alone():
    environ: dict[str, str] = {"LOCAL_RANK": "1"}
    with confine_rank_to_its_device(environ):
        assert "NEURON_RT_VISIBLE_CORES" not in environ


def test_a_packed_neuron_job_with_more_ranks_than_cores_is_refused_before_any_rank(tmp_path, monkeypatch):
    """On a machine whose device probe finds NeuronCores (stood in: torch-neuronx is not here)."""
    cores = DeviceSpec(type="neuron", count=8, default_attention="sdpa", visible_devices_env="NEURON_RT_VISIBLE_CORES")
    monkeypatch.setitem(devices.DEVICES, "neuron", lambda: cores)
    args = ["device=neuron", "launcher.devices_per_job=2", "launcher.nproc_per_node=4", "logger=none"]
    result = in_process(args, tmp_path / "run")
    assert result.returncode == 2, result.stderr[-2000:]
    assert "launcher.nproc_per_node" in result.stderr and "launcher.devices_per_job=2" in result.stderr
