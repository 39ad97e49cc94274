"""Command-line overrides (``key=value``, ``+key=value``, ``~key``) read with Hydra's own parser."""

from __future__ import annotations

from hydra.core.override_parser.overrides_parser import OverridesParser

# The key a sweep's replicates differ in (``sweep.seeds``): a run's seed, of its init and data order.
SEED_KEY = "training.seed"
SEEDS_KEY = "sweep.seeds"


def override_key(override: str) -> str:
    """``model.top_k`` of ``model.top_k=2`` (also of ``+key=v``, ``++key=v`` and ``~key``)."""
    return override.split("=", 1)[0].lstrip("+~")


def override_values(overrides: list[str]) -> dict[str, str]:
    """Each override's key and its value as written (a sweep's whole list, ``1,2,4``)."""
    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except Exception:  # noqa: BLE001 - Hydra has already refused malformed overrides by now
        return {override_key(o): o.split("=", 1)[1] for o in overrides if "=" in o}
    return {o.get_key_element().lstrip("+~"): o.input_line.split("=", 1)[1] for o in parsed if o.input_line and "=" in o.input_line}
