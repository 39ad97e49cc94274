"""PyTorch's memory trackers (``MemTracker``, ``FSDPMemTracker``), set up for torchtitan's step
under FakeTensorMode, where no storage is allocated, so a step of any size is measured here.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed._tools.mem_tracker import MemTracker
from torch.distributed._tools.mod_tracker import ModTracker

# A name that never belongs to a module: it stands for "inside the training step".
_STEP = "<training step>"


class StepModTracker(ModTracker):
    """``ModTracker`` that allows several backward passes in one step.

    torchtitan's ``ChunkedLossWrapper`` runs ``lm_head`` forward and backward once per chunk.
    ``ModTracker`` resets its parents after every backward, so the trackers would read the next
    chunk as a new iteration and raise; keeping the step among the parents avoids it."""

    @property
    def parents(self) -> set[str]:
        return self._parents

    @parents.setter
    def parents(self, value: set[str]) -> None:
        self._parents = set(value) | {_STEP}


def for_torchtitan_step(tracker: MemTracker) -> MemTracker:
    tracker._mod_tracker = StepModTracker()
    return tracker


def by_category(snapshot: dict[torch.device, dict[Any, int]]) -> dict[str, int]:
    """A tracker snapshot summed over devices, keyed by category name (``"Total"`` included)."""
    out: dict[str, int] = {}
    for per_device in snapshot.values():
        for category, nbytes in per_device.items():
            name = category if isinstance(category, str) else category.value
            out[name] = out.get(name, 0) + int(nbytes)
    return out
