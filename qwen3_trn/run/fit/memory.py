"""What one rank holds at the peak of a training step, and which model produced the figure."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

GIB = 1 << 30

# Which model produced a figure (recorded with it).
SOURCES = {
    "tracker": "torch FSDPMemTracker over rank 0 built on torchtitan's fake backend under FakeTensorMode",
    "composed": "parameter shards from torchtitan's model and layout; activations measured by torch MemTracker "
    "on torchtitan's model cut to two blocks under FakeTensorMode",
    "analytic": "parameter shards from torchtitan's model and layout; activations from a closed-form estimate",
}


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes on rank 0 at the peak of a steady training step (the second: optimizer states exist)."""

    # Its shards of the parameters (master dtype) and the model's buffers.
    params: int
    grads: int
    # AdamW's exp_avg and exp_avg_sq.
    optimizer: int
    # Saved activations and the temporaries of forward/backward at their peak.
    activations: int
    # FSDP's all-gathered parameters, unsharded gradients and reduce-scatter buffers at that moment.
    fsdp_buffers: int
    # The step's peak: persistent state + activations + FSDP buffers at its moment (gradients freed
    # between steps are not held at the end of forward: ``detail["grads_at_peak"]``).
    peak: int
    # Allocator fragmentation and the runtime's own memory (see fit.device_memory.margin_bytes).
    margin: int
    source: str
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return self.peak + self.margin

    def to_record(self) -> dict[str, Any]:
        return {
            **{f"{name}_gib": round(getattr(self, name) / GIB, 4) for name in (*_FIELDS, "total")},
            "bytes": {name: getattr(self, name) for name in _FIELDS},
            "source": self.source,
            "source_description": SOURCES[self.source],
            **({"detail": self.detail} if self.detail else {}),
        }

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> MemoryEstimate:
        return cls(**record["bytes"], source=record["source"], detail=record.get("detail", {}))


_FIELDS = ("params", "grads", "optimizer", "activations", "fsdp_buffers", "peak", "margin")
