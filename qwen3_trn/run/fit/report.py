"""The fit of one step: figures, the table ``mode=plan``/``check`` print, and the record they keep."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from qwen3_trn.run.fit.counts import ModelCounts
from qwen3_trn.run.fit.device_memory import DeviceMemory
from qwen3_trn.run.fit.memory import GIB, SOURCES, MemoryEstimate
from qwen3_trn.run.layout import Layout

COLUMNS = ("params", "grads", "optimizer", "activations", "fsdp_buffers", "margin", "total")


def gib(nbytes: int) -> str:
    if abs(nbytes) < GIB:
        return f"{nbytes / (1 << 20):.1f} MiB"
    return f"{nbytes / GIB:.2f} GiB" if abs(nbytes) < 100 * GIB else f"{nbytes / GIB:.0f} GiB"


def billions(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e8 else f"{n / 1e6:.2f} M"


@dataclass(frozen=True)
class FitReport:
    counts: ModelCounts
    memory: MemoryEstimate
    budget: DeviceMemory
    layout: Layout
    precision: str
    # Why parallelism=auto chose this layout (None: the layout was given).
    choice: str | None = None
    # The tracker's measurement of the same step (mode=check), next to ``memory``.
    tracked: MemoryEstimate | None = None

    @property
    def decisive(self) -> MemoryEstimate:
        """The figure the verdict uses: the tracker's where it ran, else the estimate."""
        return self.tracked or self.memory

    @property
    def fits(self) -> bool:
        return self.decisive.total <= self.budget.per_rank

    @property
    def headroom(self) -> int:
        return self.budget.per_rank - self.decisive.total

    def model_line(self) -> str:
        c = self.counts
        return (
            f"{billions(c.total)} parameters ({billions(c.active)} active per token, {billions(c.non_embedding)} "
            f"without embeddings); {c.flops_per_token / 1e9:.3g} GFLOP per token at seq_len {c.seq_len} "
            "(torchtitan's count)"
        )

    def verdict(self) -> str:
        if self.fits:
            return f"fits: yes, headroom {gib(self.headroom)} per rank"
        return f"fits: NO, short by {gib(-self.headroom)} per rank"

    def breakdown(self, estimate: MemoryEstimate | None = None) -> str:
        e = estimate or self.decisive
        return ", ".join(f"{name.replace('_', ' ')} {gib(getattr(e, name))}" for name in COLUMNS)

    def table(self) -> str:
        rows = [("", *COLUMNS)]
        for name, estimate in (("estimate", self.memory), ("tracker", self.tracked)):
            if estimate is not None:
                rows.append((f"{name} ({estimate.source})", *(gib(getattr(estimate, c)) for c in COLUMNS)))
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        lines = [
            f"model: {self.model_line()}",
            f"rank 0 of {self.layout.describe()}; dtypes: {self.precision}",
            *("  ".join(cell.rjust(width) if i else cell.ljust(width) for i, (cell, width) in enumerate(zip(row, widths))) for row in rows),
            f"device memory per rank: {self.budget.describe()}",
            self.verdict(),
            *(f"source {e.source}: {SOURCES[e.source]}" for e in (self.memory, self.tracked) if e is not None),
        ]
        if "peak_at" in self.memory.detail:
            held = self.memory.detail["grads_at_peak"]
            lines.append(f"estimate's peak: {self.memory.detail['peak_at']}, gradients held then {gib(held)}")
        if self.tracked is not None and self.memory.total:
            lines.append(f"tracker / estimate: {self.tracked.total / self.memory.total:.2f}")
        if self.choice:
            lines.append(f"layout chosen by parallelism=auto: {self.choice}")
        return "\n".join(lines)

    def to_record(self) -> dict[str, Any]:
        return {
            "parameters": self.counts.to_record(),
            "layout": self.layout.describe(),
            "precision": self.precision,
            "memory_per_rank": self.memory.to_record(),
            **({"tracked_per_rank": self.tracked.to_record()} if self.tracked is not None else {}),
            "device_memory": self.budget.to_record(),
            "fits": self.fits,
            "headroom_gib": round(self.headroom / GIB, 3),
            **({"auto_layout": self.choice} if self.choice else {}),
        }
