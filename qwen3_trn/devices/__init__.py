"""Device types the project trains on, and how ``device=auto`` picks one: ``DEVICES`` maps a
name to a probe returning a ``DeviceSpec``, or why the device is absent.
"""

from __future__ import annotations

import functools
import importlib
import os
from pathlib import Path
from typing import Callable

import torch

from qwen3_trn.common.errors import ConfigError
from qwen3_trn.devices import cpu, neuron
from qwen3_trn.devices.base import DeviceSpec

__all__ = [
    "DeviceSpec",
    "DEVICES",
    "AUTO_ORDER",
    "PACKING_RULES",
    "SHARED_RANK_ENV",
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
        activate=neuron.activate,
    )


DEVICES: dict[str, Callable[[], DeviceSpec]] = {
    "neuron": _probe_neuron,
    "cuda": _probe_cuda,
    "cpu": _probe_cpu,
}
AUTO_ORDER = ("neuron", "cuda", "cpu")
DEFAULT_ATTENTION = {"neuron": "sdpa", "cuda": "flex", "cpu": "sdpa"}


# Why a packed job (launcher.devices_per_job, nproc_per_node) cannot run on a device type, or None.
PACKING_RULES: dict[str, Callable[[int, int], str | None]] = {
    "neuron": neuron.packing_refusal,
}
# Per device type: the environment every rank of a job gets, given a directory all its nodes share.
SHARED_RANK_ENV: dict[str, Callable[[Path], dict[str, str]]] = {
    "neuron": neuron.neff_cache_env,
}


def planned_device(name: str) -> DeviceSpec:
    """A device not on this machine, described well enough to plan a run for it."""
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
