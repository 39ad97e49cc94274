"""Device packing: concurrent jobs on one machine, each on a disjoint slice of its devices.

A slot is one device (GPU, NeuronCore or CPU core) guarded by a lock file. A job claims the
slots it needs under a short machine-wide lock and holds them for its lifetime; the kernel
releases them if the job dies. A job that asks for more than is free waits.
"""

from __future__ import annotations

import fcntl
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import torch

from qwen3_trn.common.errors import ConfigError
from qwen3_trn.results.records import SLOTS_DIR_ENV


def _cpu_slice(slots: list[int]) -> dict[str, str]:
    # The elastic launcher's children inherit this process's affinity. A rank run in this process
    # has its thread pools already: each of its threads is pinned (sched_setaffinity pins one) and
    # torch's intra-op pool sized to the slice; more threads than cores wait for each other in
    # OpenMP's spin, and two packed jobs then ran their steps 100x slower.
    for thread in os.listdir("/proc/self/task"):
        os.sched_setaffinity(int(thread), slots)
    torch.set_num_threads(len(slots))
    return {"OMP_NUM_THREADS": str(len(slots))}


def _visible(variable: str) -> Callable[[list[int]], dict[str, str]]:
    return lambda slots: {variable: ",".join(map(str, slots))}


# How a slice is handed to a job, per device type.
SLICE_BINDERS: dict[str, Callable[[list[int]], dict[str, str]]] = {
    "cpu": _cpu_slice,
    "cuda": _visible("CUDA_VISIBLE_DEVICES"),
    "neuron": _visible("NEURON_RT_VISIBLE_CORES"),
}


@dataclass(frozen=True)
class DeviceSlots:
    lock_dir: Path
    total: int

    def _try_claim(self, count: int) -> tuple[list[int], list[int]]:
        taken: list[int] = []
        handles: list[int] = []
        for slot in range(self.total):
            fd = os.open(self.lock_dir / f"slot-{slot}.lock", os.O_CREAT | os.O_RDWR, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            taken.append(slot)
            handles.append(fd)
            if len(taken) == count:
                return taken, handles
        for fd in handles:
            os.close(fd)
        return [], []

    @contextmanager
    def claim(self, count: int, poll_s: float = 0.2) -> Iterator[list[int]]:
        if not 0 < count <= self.total:
            raise ConfigError(
                "launcher.devices_per_job",
                f"{count} device(s) per job cannot be packed onto {self.total}; use 1..{self.total}.",
            )
        self.lock_dir.mkdir(parents=True, exist_ok=True)
        guard = os.open(self.lock_dir / "claim.lock", os.O_CREAT | os.O_RDWR, 0o644)
        try:
            while True:
                fcntl.flock(guard, fcntl.LOCK_EX)
                slots, handles = self._try_claim(count)
                fcntl.flock(guard, fcntl.LOCK_UN)
                if slots:
                    break
                time.sleep(poll_s)
        finally:
            os.close(guard)
        try:
            yield slots
        finally:
            for fd in handles:
                os.close(fd)


def default_lock_dir(device_type: str) -> Path:
    return Path(os.environ.get(SLOTS_DIR_ENV, "/tmp/qwen3_trn_slots")) / device_type
