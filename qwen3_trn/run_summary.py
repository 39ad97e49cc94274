"""A run's headline figures from its per-step records (no torch import: reports use it too)."""

from __future__ import annotations

import math
from typing import Any


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """First/last loss, steady-state throughput (step 1 excluded: it includes warm-up), peaks,
    and the held-out figures of the last validation."""
    train = [r for r in records if "loss" in r]
    if not train:
        return {"steps_logged": 0}
    steady = [r for r in train[1:] if "tokens_per_s" in r] or train
    mean = lambda key: sum(r.get(key, 0.0) for r in steady) / len(steady)  # noqa: E731
    summary = {
        "steps_logged": len(train),
        "first_step": train[0]["step"],
        "last_step": train[-1]["step"],
        "first_loss": train[0].get("loss"),
        "last_loss": train[-1].get("loss"),
        "min_loss": min(r.get("loss", math.inf) for r in train),
        "tokens_per_s": mean("tokens_per_s"),
        "tokens_per_s_per_rank": mean("tokens_per_s_per_rank"),
        "peak_memory_gib": max(r.get("memory_peak_gib", 0.0) for r in train),
    }
    if all("mfu_pct" in r for r in steady):
        summary["mfu_pct"] = mean("mfu_pct")
    if "seconds_since_launch" in train[0]:
        summary["seconds_to_first_step"] = train[0]["seconds_since_launch"]
    validated = [r for r in records if "val_loss" in r]
    if validated:
        summary.update(
            val_loss=validated[-1]["val_loss"],
            val_perplexity=validated[-1].get("val_perplexity"),
            val_step=validated[-1]["step"],
            first_val_loss=validated[0]["val_loss"],
            min_val_loss=min(r["val_loss"] for r in validated),
            validations=len(validated),
        )
    return summary
