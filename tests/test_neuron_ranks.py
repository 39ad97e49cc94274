"""Which NeuronCore a rank uses: torchtitan's pick against torch-neuronx's, and the packing rule.

The stand-in below follows the public mirror of aws-neuron's torch-neuronx
(parmoham-aws/test-repo-parmoham, April 2026) line by line:

- ``torch_neuronx/distributed/backend.py``, ``_set_rt_visible_cores``: NEURON_RT_VISIBLE_CORES is
  set to LOCAL_RANK only where it is unset; ``_neuron_runtime_setup``: ``_set_local_world_size
  (LOCAL_WORLD_SIZE)``, ``_set_local_device_start_index(local_rank)``, then ``nrt_init`` and
  ``assert _vnc_count() == 1`` ("Attempted to have more than one device per process").
- ``torch_neuronx/__init__.py``, ``set_device``: refuses an index ``>= device_count()``; before the
  process group ``device_count()`` is the visible-core count (``vnc_count``,
  ``csrc/core/NeuronDevice.cpp``), after it LOCAL_WORLD_SIZE.
- ``csrc/core/NeuronDevice.cpp``, ``get_vnc_id``: a tensor on ``neuron:i`` with ``i`` below the start
  index raises "Attempted to access device that doesn't attach to this process"; the one core a
  rank sees is ``neuron:<start index>``.

torchtitan's pick is its own code, run here: ``torchtitan.tools.utils.get_local_device`` (index 0
where ``device_count()`` is 1, else LOCAL_RANK), on a device module standing in for
``torch.neuron``'s ``device_count``.
"""

from __future__ import annotations

import itertools

import pytest
import torchtitan.tools.utils as titan_utils

from qwen3_trn import devices
from qwen3_trn.devices import DeviceSpec, neuron
from qwen3_trn.launch.packing import SLICE_BINDERS
from tests.commands import command_in_process

TRN2_CORES = 64


def _visible(value: str | None) -> int:
    """The cores NEURON_RT_VISIBLE_CORES lists ("8,9" or "8-11"); unset: the whole instance."""
    if not value:
        return TRN2_CORES
    return sum(int(last) - int(first) + 1 if last else 1 for first, _, last in (part.partition("-") for part in value.split(",")))


class NeuronStandIn:
    """torch-neuronx's device state of one rank process (module docstring)."""

    def __init__(self, environ: dict[str, str]):
        self.environ = environ
        self.local_world_size: int | None = None
        self.start_index = 0

    def device_count(self) -> int:
        return self.local_world_size if self.local_world_size is not None else _visible(self.environ.get("NEURON_RT_VISIBLE_CORES"))

    def set_device(self, index: int) -> None:
        if index < 0 or index >= self.device_count():
            raise ValueError(f"Invalid device id: {index}. Valid range is 0 to {self.device_count() - 1}")

    def init_process_group(self) -> None:
        if not self.environ.get("NEURON_RT_VISIBLE_CORES"):
            self.environ["NEURON_RT_VISIBLE_CORES"] = self.environ["LOCAL_RANK"]
        self.local_world_size = int(self.environ["LOCAL_WORLD_SIZE"])
        self.start_index = int(self.environ["LOCAL_RANK"])
        assert _visible(self.environ["NEURON_RT_VISIBLE_CORES"]) == 1, (
            "Attempted to have more than one device per process in distributed setup"
        )

    def vnc_id(self, index: int) -> int:
        if index < self.start_index:
            raise ValueError("Attempted to access device that doesn't attach to this process")
        return index - self.start_index


def rank_agrees(environ: dict[str, str], monkeypatch) -> bool:
    """torchtitan's Trainer: get_local_device, set_device, then the process group; then a tensor on its device."""
    neuron_module = NeuronStandIn(environ)
    monkeypatch.setattr(titan_utils, "device_module", neuron_module)
    # torch-neuronx renames PrivateUse1 to "neuron" (process-wide, once); its own name does here
    monkeypatch.setattr(titan_utils, "device_type", "privateuseone")
    with monkeypatch.context() as env:
        for key, value in environ.items():
            env.setenv(key, value)
        try:
            device = titan_utils.get_local_device()
            neuron_module.set_device(device.index)
            neuron_module.init_process_group()
            neuron_module.vnc_id(device.index)
        except (ValueError, AssertionError):
            return False
    return True


def packed_job(cores: list[int], ranks: int) -> list[dict[str, str]]:
    """Every rank's environment in a packed job: the slice's binder (qwen3_trn.launch.packing)."""
    slice_env = SLICE_BINDERS["neuron"](cores)
    return [{**slice_env, "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(ranks)} for rank in range(ranks)]


def test_an_unpacked_job_agrees_on_every_rank(monkeypatch):
    ranks = [{"LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(TRN2_CORES)} for rank in (0, 1, 37, 63)]
    assert all(rank_agrees(environ, monkeypatch) for environ in ranks)


# Jobs of at most one rank per core (a rank takes a core of its own).
@pytest.mark.parametrize(("devices_per_job", "ranks"), [(d, r) for d, r in itertools.product((1, 2, 4), (1, 2, 4)) if r <= d])
def test_packing_rule_refuses_exactly_the_jobs_whose_ranks_disagree(devices_per_job, ranks, monkeypatch):
    cores = list(range(8, 8 + devices_per_job))
    agrees = all(rank_agrees(environ, monkeypatch) for environ in packed_job(cores, ranks))
    assert (neuron.packing_refusal(devices_per_job, ranks) is None) == agrees


def test_narrowing_each_rank_to_its_own_core_disagrees_for_every_rank_but_the_first(monkeypatch):
    """What a packed job did before: each rank's NEURON_RT_VISIBLE_CORES narrowed to its core of the slice."""
    narrowed = [{**environ, "NEURON_RT_VISIBLE_CORES": str(8 + rank)} for rank, environ in enumerate(packed_job([8, 9, 10], 3))]
    assert [rank_agrees(environ, monkeypatch) for environ in narrowed] == [True, False, False]


@pytest.mark.parametrize(("devices_per_job", "nproc"), [(2, 2), (2, -1), (1, 1)])
def test_a_packed_neuron_job_is_refused_before_any_rank_unless_one_rank_on_one_core(devices_per_job, nproc, tmp_path, monkeypatch):
    """On a machine whose device probe finds NeuronCores (stood in: torch-neuronx is not here)."""
    cores = DeviceSpec(type="neuron", count=8, default_attention="sdpa", visible_devices_env="NEURON_RT_VISIBLE_CORES")
    monkeypatch.setitem(devices.DEVICES, "neuron", lambda: cores)
    args = ["device=neuron", f"launcher.devices_per_job={devices_per_job}", f"launcher.nproc_per_node={nproc}", "logger=none"]
    result = command_in_process([*args, "mode=plan", "model=debugmodel"], tmp_path / "run")
    if devices_per_job == 1:
        assert result.returncode == 0, result.stderr[-2000:]
        return
    assert result.returncode == 2, result.stderr[-2000:]
    error = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "launcher.devices_per_job" in error[0], result.stderr[-2000:]
    assert "start index to its LOCAL_RANK" in error[0]
    assert "torch_neuronx/distributed/backend.py" in error[0]
