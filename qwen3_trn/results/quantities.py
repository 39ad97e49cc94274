"""The figures of a run (``summary.json``) in one table: key, name, unit, better direction,
format and the per-step records each is taken from (``records.summarize``). Imports nothing of
the package.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import Any, Iterable


class Better(str, Enum):
    lower = "lower"
    higher = "higher"


class Over(str, Enum):
    """The per-step records a figure is taken over."""

    train = "train"  # every step that logged a training loss
    # the training steps after the first (warm-up) that logged throughput; every training step when none did
    steady = "steady"
    validated = "validated"  # every step that logged a validation loss


class Take(str, Enum):
    """How a figure is taken from its records' values (a missing value: ``summarize``)."""

    first = "first"
    last = "last"
    min = "min"
    max = "max"
    mean = "mean"
    count = "count"


@dataclass(frozen=True)
class Source:
    """Where ``records.summarize`` takes a figure from: ``field`` of the records ``over``."""

    field: str
    over: Over
    take: Take
    # written only when every record it is taken from has the field (else left out of the summary)
    every: bool = False


@dataclass(frozen=True)
class Quantity:
    key: str  # the run's figure (summary.json)
    name: str  # in titles and sentences
    column: str  # a table's heading, with the unit
    unit: str
    better: Better | None
    decimals: int
    source: Source | None = None  # None: the run records it itself (its wall time)
    reported: bool = True  # compared across runs: in each sweep job's record and the reports' tables
    csv: str = ""  # the report's CSV column; the key when empty

    def format(self, value: Any) -> str:
        """The value as people write it: thousands separated, as many decimals as it carries."""
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return ""
        return f"{float(value):,.{self.decimals}f}"

    def with_unit(self, value: Any) -> str:
        text = self.format(value)
        return f"{text} {self.unit}".rstrip() if text and self.unit not in ("", "%") else text + self.unit

    def best(self, values: Iterable[float]) -> float:
        return (max if self.better == Better.higher else min)(values)

    def direction(self) -> str:
        """``lower is better`` (or higher), for captions and colour bars."""
        return f"{self.better.value} is better" if self.better else ""


_LOSS = dict(unit="", better=Better.lower, decimals=3)
_COUNT = dict(unit="", better=None, decimals=0)
# In the order summary.json writes them; the reported ones in the order of the reports' CSV.
QUANTITIES: dict[str, Quantity] = {
    q.key: q
    for q in (
        Quantity("steps_logged", "steps", "steps", **_COUNT, source=Source("step", Over.train, Take.count), csv="steps"),
        Quantity("first_step", "first step", "first step", **_COUNT, source=Source("step", Over.train, Take.first), reported=False),
        Quantity("last_step", "last step", "last step", **_COUNT, source=Source("step", Over.train, Take.last), reported=False),
        Quantity("first_loss", "first training loss", "first loss", **_LOSS, source=Source("loss", Over.train, Take.first)),
        Quantity("last_loss", "final training loss", "final loss", **_LOSS, source=Source("loss", Over.train, Take.last), csv="final_loss"),
        Quantity("min_loss", "lowest training loss", "min loss", **_LOSS, source=Source("loss", Over.train, Take.min)),
        Quantity("val_loss", "final validation loss", "val loss", **_LOSS, source=Source("val_loss", Over.validated, Take.last)),
        Quantity(
            "val_perplexity",
            "validation perplexity",
            "val perplexity",
            "",
            Better.lower,
            1,
            Source("val_perplexity", Over.validated, Take.last),
        ),
        Quantity("val_step", "last validated step", "val step", **_COUNT, source=Source("step", Over.validated, Take.last), reported=False),
        Quantity(
            "first_val_loss",
            "first validation loss",
            "first val loss",
            **_LOSS,
            source=Source("val_loss", Over.validated, Take.first),
            reported=False,
        ),
        Quantity(
            "min_val_loss",
            "lowest validation loss",
            "min val loss",
            **_LOSS,
            source=Source("val_loss", Over.validated, Take.min),
            reported=False,
        ),
        Quantity("validations", "validations", "validations", **_COUNT, source=Source("step", Over.validated, Take.count), reported=False),
        Quantity("tokens_per_s", "throughput", "tokens/s", "tokens/s", Better.higher, 0, Source("tokens_per_s", Over.steady, Take.mean)),
        Quantity(
            "tokens_per_s_per_rank",
            "throughput per rank",
            "tokens/s per rank",
            "tokens/s",
            Better.higher,
            0,
            Source("tokens_per_s_per_rank", Over.steady, Take.mean),
            reported=False,
        ),
        Quantity(
            "peak_memory_gib", "peak memory", "peak memory (GiB)", "GiB", Better.lower, 2, Source("memory_peak_gib", Over.train, Take.max)
        ),
        Quantity("mfu_pct", "MFU", "MFU (%)", "%", Better.higher, 1, Source("mfu_pct", Over.steady, Take.mean, every=True)),
        Quantity(
            "seconds_to_first_step",
            "time to the first step",
            "to first step (s)",
            "s",
            Better.lower,
            1,
            Source("seconds_since_launch", Over.train, Take.first, every=True),
            reported=False,
        ),
        Quantity("wall_time_s", "wall time", "wall time (s)", "s", Better.lower, 1),
    )
}
# The figures compared across runs, in the table's order.
REPORTED = tuple(key for key, q in QUANTITIES.items() if q.reported)


__all__ = ["QUANTITIES", "REPORTED", "Better", "Over", "Quantity", "Source", "Take"]
