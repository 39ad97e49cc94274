"""Device types the project trains on, and how ``device=auto`` picks one.

``DEVICES`` maps a device name to a probe that returns a ``DeviceSpec`` when the device is
present on this machine, or the reason it is not.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
from typing import Callable, Iterator, MutableMapping

import torch

from qwen3_trn.devices import cpu
from qwen3_trn.devices.base import DeviceSpec
from qwen3_trn.errors import ConfigError

__all__ = [
    "DeviceSpec",
    "DEVICES",
    "AUTO_ORDER",
    "ONE_DEVICE_PER_PROCESS_ENV",
    "confine_rank_to_its_device",
    "planned_device",
    "probe_device",
    "resolve_device",
]


class DeviceAbsent(Exception):
    """A probe's answer: this device type is not usable here, and why."""


def _probe_cpu() -> DeviceSpec:
    return DeviceSpec(
        type="cpu",
        count=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1,
        default_attention=DEFAULT_ATTENTION["cpu"],
        fast_bf16=cpu.has_native_bf16(),
        activate=cpu.activate,
        adapt_model_spec=cpu.adapt_model_spec,
    )


def _probe_cuda() -> DeviceSpec:
    if not torch.cuda.is_available():
        raise DeviceAbsent(f"torch.cuda.is_available() is False (torch {torch.__version__}, CUDA build: {torch.version.cuda or 'none'})")
    return DeviceSpec(
        type="cuda",
        count=torch.cuda.device_count(),
        default_attention=DEFAULT_ATTENTION["cuda"],
        visible_devices_env="CUDA_VISIBLE_DEVICES",
    )


def _activate_neuron(compute_dtype: str = "float32") -> None:
    # torch-neuronx registers the "neuron" device and process-group backend on import;
    # torchtitan-neuron, when installed, adds its models and Neuron-specific components.
    importlib.import_module("torch_neuronx")
    try:
        importlib.import_module("torchtitan_neuron")
    except ImportError:
        pass


def _probe_neuron() -> DeviceSpec:
    try:
        importlib.import_module("torch_neuronx")
    except ImportError as exc:
        raise DeviceAbsent(f"torch-neuronx is not importable ({exc})") from exc
    neuron = getattr(torch, "neuron", None)
    if neuron is None or not hasattr(neuron, "device_count"):
        raise DeviceAbsent(
            "torch-neuronx imports but registered no 'neuron' device (PyPI's torch-neuronx is an empty "
            "placeholder; the Neuron SDK's build is the one that registers it)"
        )
    count = int(neuron.device_count())
    if count == 0:
        raise DeviceAbsent("torch-neuronx sees no NeuronCores")
    return DeviceSpec(
        type="neuron",
        count=count,
        default_attention=DEFAULT_ATTENTION["neuron"],
        visible_devices_env="NEURON_RT_VISIBLE_CORES",
        activate=_activate_neuron,
    )


DEVICES: dict[str, Callable[[], DeviceSpec]] = {
    "neuron": _probe_neuron,
    "cuda": _probe_cuda,
    "cpu": _probe_cpu,
}
AUTO_ORDER = ("neuron", "cuda", "cpu")
DEFAULT_ATTENTION = {"neuron": "sdpa", "cuda": "flex", "cpu": "sdpa"}


# Variables that list the devices a process may use, where the distributed backend takes exactly
# one per process. torch-neuronx's process group (torch_neuronx/distributed/backend.py,
# ``_neuron_runtime_setup``) sets NEURON_RT_VISIBLE_CORES to LOCAL_RANK only when it is unset,
# then asserts that the process sees one core; a packed job's ranks all inherit the job's slice
# ``a,b,...`` (qwen3_trn.launch.packing), so each rank keeps its own core of it.
ONE_DEVICE_PER_PROCESS_ENV = ("NEURON_RT_VISIBLE_CORES",)


def _listed_devices(value: str) -> list[str]:
    """``"8,9"`` or ``"8-11"`` (the Neuron runtime's two forms) -> the devices, in order."""
    devices = []
    for part in value.split(","):
        first, _, last = part.strip().partition("-")
        devices += [str(i) for i in range(int(first), int(last) + 1)] if last else [first]
    return devices


@contextlib.contextmanager
def confine_rank_to_its_device(environ: MutableMapping[str, str] = os.environ) -> Iterator[None]:
    """In a rank's process, before any device runtime starts: where a variable of
    ``ONE_DEVICE_PER_PROCESS_ENV`` lists several devices (a packed job's slice), keep the
    rank's own, the LOCAL_RANK-th; restored on exit (a one-rank world trains in the launching
    process)."""
    saved = {variable: environ[variable] for variable in ONE_DEVICE_PER_PROCESS_ENV if variable in environ}
    for variable, value in saved.items():
        devices = _listed_devices(value)
        if len(devices) <= 1:
            continue
        local_rank = int(environ.get("LOCAL_RANK", "0"))
        if local_rank >= len(devices):
            raise RuntimeError(
                f"local rank {local_rank} has no device of its own: {variable}={value} lists {len(devices)}, and each "
                "rank takes one. Start at most that many ranks per node (launcher.nproc_per_node), or give the job one "
                "device per rank (launcher.devices_per_job)."
            )
        environ[variable] = devices[local_rank]
    try:
        yield
    finally:
        environ.update(saved)


def planned_device(name: str) -> DeviceSpec:
    """A device that is not on this machine, described well enough to plan a run for it."""
    return DeviceSpec(type=name, count=0, default_attention=DEFAULT_ATTENTION[name])


@functools.cache
def probe_device(name: str) -> DeviceSpec | str:
    """The device's spec, or a sentence saying why it is absent."""
    try:
        return DEVICES[name]()
    except DeviceAbsent as exc:
        return str(exc)


def resolve_device(requested: str) -> DeviceSpec:
    if requested == "auto":
        for name in AUTO_ORDER:
            spec = probe_device(name)
            if isinstance(spec, DeviceSpec):
                return spec
        raise AssertionError("the CPU is always available")
    if requested not in DEVICES:
        raise ConfigError("device", f"unknown device '{requested}'; use one of auto, {', '.join(DEVICES)}.")
    spec = probe_device(requested)
    if isinstance(spec, str):
        raise ConfigError(
            "device",
            f"device={requested} was requested but is not available here: {spec}. Use device=auto (or device=cpu) on this machine.",
        )
    return spec
