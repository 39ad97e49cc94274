"""Every number's range, read from its key (``keys.key(..., ge=1)``), checked.

A bound is a number or another key (``le="training.steps"``); every float must be finite.
Unset optional keys and keys of options the run does not use are not checked.
"""

from __future__ import annotations

import math
import operator
from typing import Any

from qwen3_trn.common.errors import ConfigError, grouped
from qwen3_trn.config.keys import Range, default_of, facts, leaves, schema_fields
from qwen3_trn.config.schema import RunConfig

_COMPARE = {"ge": (operator.ge, ">="), "gt": (operator.gt, ">"), "le": (operator.le, "<="), "lt": (operator.lt, "<")}

_MISSING = object()


def lookup(cfg: Any, key: str) -> Any:
    """The value of a dotted key, or ``_MISSING`` when the chosen option has no such key."""
    node = cfg
    for part in key.split("."):
        node = getattr(node, part, _MISSING)
        if node is _MISSING:
            return _MISSING
    return node


def all_ranges(schema: type = RunConfig) -> dict[str, Range]:
    """The range of every ranged key of ``schema``, every registered option's included."""
    return {dotted: facts(field).range for dotted, field in schema_fields(schema) if facts(field).range}


def violation(rule: Range, value: Any, cfg: Any) -> str | None:
    """Why ``value`` is out of ``rule``'s range (None when it is in range)."""
    if value in rule.allow:
        return None
    if value in rule.exclude:
        return f"{value!r} is not allowed"
    for name, bound in rule.bounds():
        compare, symbol = _COMPARE[name]
        limit = lookup(cfg, bound) if isinstance(bound, str) else bound
        if limit is _MISSING or limit is None:
            continue
        if not compare(value, limit):
            shown = f"{bound} ({limit})" if isinstance(bound, str) else f"{limit:g}"
            return f"must be {symbol} {shown}, got {value!r}"
    return None


def describe(rule: Range) -> str:
    parts = [
        f"{_COMPARE[name][1]} {bound}" if isinstance(bound, str) else f"{_COMPARE[name][1]} {bound:g}" for name, bound in rule.bounds()
    ]
    return " and ".join(parts) + (f" ({rule.note})" if rule.note else "")


def _default_hint(field: Any) -> str:
    default = default_of(field)
    return f" (the default is {default})" if default is not None else ""


def range_problems(cfg: Any, prefix: str = "") -> list[ConfigError]:
    """A ``ConfigError`` for every non-finite float and out-of-range key of ``cfg``; ``prefix``
    goes before the keys named."""
    problems, not_finite = [], []
    for dotted, field, value in leaves(cfg):
        if isinstance(value, float) and not math.isfinite(value):
            rule = facts(field).range
            valid = f"valid: {describe(rule)}" if rule else "give a finite number"
            problems.append(ConfigError(prefix + dotted, f"must be a finite number, got {value}; {valid}{_default_hint(field)}."))
            not_finite.append(dotted)
    for dotted, field, value in leaves(cfg):
        rule = facts(field).range
        if rule is None or value is None or isinstance(value, bool) or dotted in not_finite:
            continue
        problem = violation(rule, value, cfg)
        if problem:
            problems.append(ConfigError(prefix + dotted, f"{problem}; valid: {describe(rule)}{_default_hint(field)}."))
    return problems


def check_ranges(cfg: Any, prefix: str = "") -> None:
    """Raise every out-of-range or non-finite key together."""
    problems = range_problems(cfg, prefix)
    if problems:
        raise grouped(problems)
