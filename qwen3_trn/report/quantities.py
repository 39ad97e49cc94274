"""The figures a report shows of each run (``summary.json`` / ``qwen3_trn.results.records.summarize``):
name, unit, which direction is better and how to write the number. Every plot, table and
heatmap of the report reads them from here, and so does the seed statistics (``Spread``): the
mean over a config's seeds and their range, and whether two configs differ beyond it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import Any, Iterable


class Better(str, Enum):
    lower = "lower"
    higher = "higher"


@dataclass(frozen=True)
class Quantity:
    key: str  # the run's figure (summary.json)
    name: str  # in titles and sentences
    column: str  # a table's heading, with the unit
    unit: str
    better: Better | None
    decimals: int

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
QUANTITIES: dict[str, Quantity] = {
    q.key: q
    for q in (
        Quantity("steps_logged", "steps", "steps", "", None, 0),
        Quantity("first_loss", "first training loss", "first loss", **_LOSS),
        Quantity("last_loss", "final training loss", "final loss", **_LOSS),
        Quantity("min_loss", "lowest training loss", "min loss", **_LOSS),
        Quantity("val_loss", "final validation loss", "val loss", **_LOSS),
        Quantity("val_perplexity", "validation perplexity", "val perplexity", "", Better.lower, 1),
        Quantity("tokens_per_s", "throughput", "tokens/s", "tokens/s", Better.higher, 0),
        Quantity("peak_memory_gib", "peak memory", "peak memory (GiB)", "GiB", Better.lower, 2),
        Quantity("mfu_pct", "MFU", "MFU (%)", "%", Better.higher, 1),
        Quantity("wall_time_s", "wall time", "wall time (s)", "s", Better.lower, 1),
    )
}


@dataclass(frozen=True)
class Spread:
    """One figure of a config over its seeds: the mean and the range (min to max)."""

    values: tuple[float, ...]

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float:
        return sum(self.values) / len(self.values)

    @property
    def low(self) -> float:
        return min(self.values)

    @property
    def high(self) -> float:
        return max(self.values)

    def overlaps(self, other: Spread) -> bool:
        return self.low <= other.high and other.low <= self.high

    def text(self, quantity: Quantity) -> str:
        """``6.929`` for one seed, ``6.929 (6.912–6.946)`` for several: mean (min–max)."""
        if self.n == 1:
            return quantity.format(self.mean)
        return f"{quantity.format(self.mean)} ({quantity.format(self.low)}–{quantity.format(self.high)})"


def spread(values: Iterable[Any]) -> Spread | None:
    present = tuple(float(v) for v in values if v is not None and not (isinstance(v, float) and math.isnan(v)))
    return Spread(present) if present else None


# Marks of a config's figure against the best config's (several seeds each).
BEST_MARK = "★"
TIED_MARK = "≈"
MARKS_LEGEND = (
    f"{BEST_MARK} the best mean; {TIED_MARK} within the seed spread of the best (their min–max ranges overlap); "
    "unmarked: worse than the best beyond the seed spread"
)


def marks(quantity: Quantity, spreads: dict[Any, Spread]) -> dict[Any, str]:
    """Each config's mark for one figure (``MARKS_LEGEND``); none where a config has a single
    seed (no spread to compare with) or the figure has no better direction."""
    if quantity.better is None or len(spreads) < 2 or any(s.n < 2 for s in spreads.values()):
        return {}
    best_mean = quantity.best(s.mean for s in spreads.values())
    best = next(k for k, s in spreads.items() if s.mean == best_mean)
    return {k: BEST_MARK if k == best else TIED_MARK if s.overlaps(spreads[best]) else "" for k, s in spreads.items()}


__all__ = ["BEST_MARK", "MARKS_LEGEND", "QUANTITIES", "TIED_MARK", "Better", "Quantity", "Spread", "marks", "spread"]
