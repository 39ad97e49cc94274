"""What the rest of the project needs to know about a device type."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from qwen3_trn.titan import ModelSpec


@dataclass(frozen=True)
class DeviceSpec:
    """A resolved device type and how torchtitan must be run on it."""

    type: str
    # Devices a node offers to ranks (GPUs, NeuronCores, or CPU cores).
    count: int
    # Inner attention used when model.attention=auto.
    default_attention: str
    # Whether bf16 matmuls run natively (FSDP's mixed precision picks bf16 only then).
    fast_bf16: bool = True
    # Environment variable that restricts a process to a subset of devices.
    visible_devices_env: str | None = None
    # In-process adaptations of torchtitan for this device, given the compute dtype (once per process).
    activate: Callable[[str], None] = field(default=lambda compute_dtype: None, repr=False, compare=False)
    # Rewrites a ModelSpec for this device (e.g. CPU collectives); identity elsewhere.
    adapt_model_spec: Callable[[ModelSpec], ModelSpec] = field(default=lambda spec: spec, repr=False, compare=False)
