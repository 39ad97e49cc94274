"""A run figure of a config over its seeds (``Spread``): the mean over the seeds and their
range, and whether two configs differ beyond it (``marks``). The figures themselves (name,
unit, better direction, format): ``qwen3_trn.results.quantities``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable

from qwen3_trn.results.quantities import Quantity


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


__all__ = ["BEST_MARK", "MARKS_LEGEND", "TIED_MARK", "Spread", "marks", "spread"]
