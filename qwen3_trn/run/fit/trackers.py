"""PyTorch's memory trackers, set up for torchtitan's training step under FakeTensorMode.

``torch.distributed._tools`` (``MemTracker``, ``FSDPMemTracker``) attributes every storage a
step creates to parameters, gradients, optimizer states, activations or temporaries. Under
``FakeTensorMode`` those storages are never allocated, so a step of any size is measured on a
laptop. This module holds the one adaptation they need for torchtitan, and reads their figures.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed._tools.mem_tracker import MemTracker
from torch.distributed._tools.mod_tracker import ModTracker

# A name that never belongs to a module: it stands for "inside the training step".
_STEP = "<training step>"


class StepModTracker(ModTracker):
    """``ModTracker`` that knows a step can run several backward passes.

    torchtitan's ``ChunkedLossWrapper`` runs forward *and* backward of ``lm_head`` once per
    sequence chunk, inside one step. ``ModTracker`` resets its ``parents`` to ``{"Global"}``
    after every backward pass, and the memory trackers then read the next chunk's ``lm_head``
    call as the start of a new iteration and raise ("does not support memory tracking for
    multiple iterative calls"). Keeping the step itself among the parents makes those calls
    what they are: repeated calls of a submodule within one step.
    """

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
