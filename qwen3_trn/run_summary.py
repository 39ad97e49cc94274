"""A run's headline figures from its per-step records (no torch import: reports use it too)."""

from __future__ import annotations

import math
from typing import Any


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """First/last loss, steady-state throughput (step 1 excluded: it includes warm-up) and peaks."""
    if not records:
        return {"steps_logged": 0}
    steady = [r for r in records[1:] if "tokens_per_s" in r] or records
    mean = lambda key: sum(r.get(key, 0.0) for r in steady) / len(steady)  # noqa: E731
    summary = {
        "steps_logged": len(records),
        "first_step": records[0]["step"],
        "last_step": records[-1]["step"],
        "first_loss": records[0].get("loss"),
        "last_loss": records[-1].get("loss"),
        "min_loss": min(r.get("loss", math.inf) for r in records),
        "tokens_per_s": mean("tokens_per_s"),
        "tokens_per_s_per_rank": mean("tokens_per_s_per_rank"),
        "peak_memory_gib": max(r.get("memory_peak_gib", 0.0) for r in records),
    }
    if all("mfu_pct" in r for r in steady):
        summary["mfu_pct"] = mean("mfu_pct")
    if "seconds_since_launch" in records[0]:
        summary["seconds_to_first_step"] = records[0]["seconds_since_launch"]
    return summary
