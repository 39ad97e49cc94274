"""How much memory one rank may use, and where that figure comes from: ``device.memory_gib``,
else the device present (CPU: host memory available now, shared by the node's ranks), else the
accelerator table below for planning another machine.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from qwen3_trn.common.errors import ConfigError
from qwen3_trn.config.schema import DeviceConfig, LauncherConfig
from qwen3_trn.devices import DeviceSpec
from qwen3_trn.run.fit.memory import GIB


@dataclass(frozen=True)
class Accelerator:
    name: str
    device_type: str
    memory_gib: float
    # Devices (ranks) one node of the usual instance offers.
    per_node: int
    description: str


# Memory per device as the vendor tools report it (nvidia-smi's MiB / 1024; Neuron's HBM per
# logical core). Unverified on hardware here: this project is developed without accelerators.
ACCELERATORS: dict[str, Accelerator] = {
    a.name: a
    for a in (
        Accelerator(
            "trn2", "neuron", 24.0, 64, "Trainium2 logical NeuronCore at LNC=2 (trn2.48xlarge: 16 chips x 96 GiB HBM = 64 x 24 GiB)"
        ),
        Accelerator("trn2-lnc1", "neuron", 12.0, 128, "Trainium2 physical NeuronCore at LNC=1 (trn2.48xlarge: 128 x 12 GiB)"),
        Accelerator("trn1", "neuron", 16.0, 32, "Trainium1 NeuronCore-v2 (trn1.32xlarge: 16 chips x 32 GiB = 32 x 16 GiB)"),
        Accelerator("h100", "cuda", 79.6, 8, "NVIDIA H100 SXM 80 GB (81559 MiB)"),
        Accelerator("h200", "cuda", 140.4, 8, "NVIDIA H200 141 GB (143771 MiB)"),
        Accelerator("a100-40gb", "cuda", 40.0, 8, "NVIDIA A100 40 GB (40960 MiB)"),
        Accelerator("a100-80gb", "cuda", 80.0, 8, "NVIDIA A100 80 GB (81920 MiB)"),
        Accelerator("l4", "cuda", 22.5, 8, "NVIDIA L4 24 GB (23034 MiB)"),
        Accelerator("a10g", "cuda", 22.5, 8, "NVIDIA A10G 24 GB (23028 MiB)"),
        Accelerator("l40s", "cuda", 45.0, 8, "NVIDIA L40S 48 GB (46068 MiB)"),
        Accelerator("b200", "cuda", 178.4, 8, "NVIDIA B200 192 GB (182.7 GB usable)"),
    )
}
DEFAULT_ACCELERATOR = {"neuron": "trn2", "cuda": "h100"}
LOGICAL_CORES_ENV = "NEURON_LOGICAL_NC_CONFIG"

# The margin on top of a step's tensor peak: the allocator's fragmentation and caching, and
# the memory the runtime itself takes on each device. On CPU that is the rank's own process
# (Python, torch, torchtitan, the data pipeline: 0.8-1.0 GiB resident here before the model
# is built, see benchmarks/memory_fit.py); on CUDA the context, cuBLAS and NCCL workspaces;
# on Trainium the Neuron runtime's reservation. The accelerator figures are assumptions.
FRAGMENTATION = 0.10
RUNTIME_GIB = {"cpu": 1.25, "cuda": 1.0, "neuron": 1.0}


def margin_bytes(device_type: str, peak: int) -> int:
    return int(peak * FRAGMENTATION + RUNTIME_GIB.get(device_type, 1.0) * GIB)


@dataclass(frozen=True)
class DeviceMemory:
    """The memory one rank may use (``per_rank``) and what that figure is."""

    per_rank: int
    # The device's own figure (one accelerator; the host's available memory on CPU).
    device: int
    # Ranks of a node that share ``device`` (all of the node's ranks on CPU, else 1).
    sharing: int
    source: str

    def describe(self) -> str:
        gib = f"{self.device / GIB:.1f} GiB"
        shared = f" shared by {self.sharing} ranks: {self.per_rank / GIB:.1f} GiB per rank" if self.sharing > 1 else ""
        return f"{gib}{shared} ({self.source})"

    def to_record(self) -> dict:
        return {
            "per_rank_gib": round(self.per_rank / GIB, 3),
            "device_gib": round(self.device / GIB, 3),
            "ranks_sharing": self.sharing,
            "source": self.source,
        }


def _meminfo_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def _cgroup_available() -> int | None:
    """What the container's memory limit (cgroup v2) leaves, if one is set."""
    limit, usage = Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory.current")
    try:
        cap = limit.read_text().strip()
        if cap == "max":
            return None
        return int(cap) - int(usage.read_text().strip())
    except (OSError, ValueError):
        return None


def host_available() -> tuple[int, str]:
    available, source = _meminfo_available(), "host RAM available now (MemAvailable)"
    cgroup = _cgroup_available()
    if cgroup is not None and cgroup < available:
        available, source = cgroup, "what the container's memory limit leaves (cgroup memory.max)"
    return available, source


def accelerator(device_type: str, name: str | None, env: dict[str, str]) -> Accelerator:
    if name is None:
        name = DEFAULT_ACCELERATOR.get(device_type)
        if device_type == "neuron" and str(env.get(LOGICAL_CORES_ENV, "2")) == "1":
            name = "trn2-lnc1"
    if name not in ACCELERATORS:
        raise ConfigError("device.accelerator", f"unknown accelerator '{name}'; use one of {', '.join(ACCELERATORS)}.")
    found = ACCELERATORS[name]
    if found.device_type != device_type:
        raise ConfigError(
            "device.accelerator",
            f"'{name}' is a {found.device_type} device, but device={device_type}; "
            f"pick one of {', '.join(n for n, a in ACCELERATORS.items() if a.device_type == device_type)}.",
        )
    return found


def _present_cuda() -> tuple[int, str]:
    import torch

    sizes = [torch.cuda.get_device_properties(i).total_memory for i in range(torch.cuda.device_count())]
    name = torch.cuda.get_device_properties(0).name
    return min(sizes), f"{name}, total memory as torch.cuda reports it"


def device_memory(device_cfg: DeviceConfig, launcher: LauncherConfig, device: DeviceSpec, ranks_per_node: int) -> DeviceMemory:
    """The memory budget of one rank of ``device`` with ``ranks_per_node`` ranks on each node."""
    sharing = ranks_per_node if device.type == "cpu" else 1
    if device_cfg.memory_gib is not None:
        if device_cfg.memory_gib <= 0:
            raise ConfigError("device.memory_gib", f"must be a positive number of GiB, got {device_cfg.memory_gib}.")
        total, source = int(device_cfg.memory_gib * GIB), "device.memory_gib"
    elif device.type == "cpu":
        total, source = host_available()
    elif device.type == "cuda" and device.count > 0:
        total, source = _present_cuda()
    else:
        found = accelerator(device.type, device_cfg.accelerator, launcher.env)
        total, source = int(found.memory_gib * GIB), f"{found.description}; accelerator table"
    return DeviceMemory(per_rank=total // sharing, device=total, sharing=sharing, source=source)
