"""The valid range of every numeric key, declared once next to the schema.

``RANGES`` maps a dotted key to its ``Range``; a bound is a number or another key (``le=
"training.steps"``). The keys of one option of a group (``launcher.devices_per_job``) have their
ranges on that option's Config (``ranges``, by key within the group), beside its class. ``check_ranges`` runs whenever a config is typed (``typed.py``) and again
among preflight's checks, so a value out of range is a ``ConfigError`` naming the key, the
bound and the default before anything is prepared; every such key is reported at once. Every
float key of the schema must also be finite (no ``inf``/``nan``). Keys of an option the run
does not use (``launcher.partition`` with ``launcher=local``) and unset optional keys (None)
are not checked.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from dataclasses import dataclass
from typing import Any

from qwen3_trn.config.schema import RunConfig, option_groups
from qwen3_trn.errors import ConfigError, grouped

Bound = float | str | None

_COMPARE = {"ge": (operator.ge, ">="), "gt": (operator.gt, ">"), "le": (operator.le, "<="), "lt": (operator.lt, "<")}


@dataclass(frozen=True)
class Range:
    ge: Bound = None
    gt: Bound = None
    le: Bound = None
    lt: Bound = None
    # Values accepted outside the bounds, and what they mean ("-1: the rest").
    allow: tuple[Any, ...] = ()
    exclude: tuple[Any, ...] = ()
    note: str = ""

    def bounds(self) -> list[tuple[str, Bound]]:
        return [(name, getattr(self, name)) for name in _COMPARE if getattr(self, name) is not None]


def _degree(what: str) -> Range:
    return Range(ge=1, allow=(-1,), note=f"-1: {what}")


POSITIVE = Range(ge=1)
NON_NEGATIVE = Range(ge=0)
FRACTION = Range(ge=0, le=1)

RANGES: dict[str, Range] = {
    **{
        f"model.{key}": POSITIVE
        for key in (
            "n_layers",
            "dim",
            "n_heads",
            "n_kv_heads",
            "head_dim",
            "hidden_dim",
            "vocab_size",
            "max_seq_len",
            "num_experts",
            "top_k",
            "moe_hidden_dim",
        )
    },
    "model.rope_theta": Range(gt=0),
    **{f"parallelism.{key}": _degree("whatever is left of the world size") for key in ("dp_replicate", "dp_shard", "tp", "pp", "cp")},
    "parallelism.ep": POSITIVE,
    "parallelism.pp_microbatch_size": POSITIVE,
    "data.num_workers": NON_NEGATIVE,
    "validation.interval": Range(ge=1, note="validate every n steps; or validation=off"),
    "validation.steps": Range(ge=1, allow=(-1,), note="-1: the whole held-out split"),
    "validation.local_batch_size": POSITIVE,
    "validation.seq_len": POSITIVE,
    "checkpoint.hf_interval": Range(ge=0, note="0: export at the last step only"),
    "device.memory_gib": Range(gt=0),
    "training.steps": POSITIVE,
    "training.local_batch_size": POSITIVE,
    "training.global_batch_size": _degree("local_batch_size x the data-parallel degree"),
    "training.seq_len": POSITIVE,
    "training.max_norm": Range(gt=0),
    "training.seed": NON_NEGATIVE,
    "sweep.seeds": Range(ge=1, note="how many seeds each job of a sweep runs with"),
    "training.gc_freq": POSITIVE,
    "optimizer.lr": Range(ge=0, note="0 keeps the weights as loaded"),
    "optimizer.weight_decay": NON_NEGATIVE,
    "optimizer.beta1": Range(ge=0, lt=1),
    "optimizer.beta2": Range(ge=0, lt=1),
    "optimizer.eps": Range(gt=0),
    "optimizer.warmup_steps": Range(ge=0, le="training.steps", note="warm-up is part of training.steps"),
    "optimizer.decay_ratio": FRACTION,
    "optimizer.min_lr_factor": FRACTION,
    "checkpoint.interval": POSITIVE,
    "checkpoint.keep_latest_k": Range(ge=0, exclude=(1,), note="0 keeps all; torchtitan keeps at least 2, as the newest may be mid-save"),
    "checkpoint.load_step": Range(ge=0, allow=(-1,), note="-1: the latest"),
    "logger.log_freq": POSITIVE,
    "launcher.nnodes": POSITIVE,
    "launcher.nproc_per_node": _degree("one rank per device"),
    "launcher.max_restarts": NON_NEGATIVE,
    "sweep.trial.number": NON_NEGATIVE,
}

_MISSING = object()


def lookup(cfg: Any, key: str) -> Any:
    """The value of a dotted key on a typed config, or ``_MISSING`` when the chosen option has no such key."""
    node = cfg
    for part in key.split("."):
        node = getattr(node, part, _MISSING)
        if node is _MISSING:
            return _MISSING
    return node


def option_ranges(option: type) -> dict[str, Range]:
    """The ranges an option's Config declares, by dotted key."""
    return {f"{option.group}.{key}": rule for key, rule in option.ranges.items()}


def rules_of(cfg: Any) -> dict[str, Range]:
    """The ranges that apply to a typed config: ``RANGES`` and those of its chosen options."""
    rules = dict(RANGES)
    for group in option_groups():
        rules.update(option_ranges(type(getattr(cfg, group))))
    return rules


def all_ranges() -> dict[str, Range]:
    """``RANGES`` and the ranges of every registered option."""
    rules = dict(RANGES)
    for base in option_groups().values():
        for option in base.registered().values():
            rules.update(option_ranges(option))
    return rules


def _default(key: str) -> Any:
    return lookup(RunConfig(output_dir=""), key)


def violation(key: str, rule: Range, value: Any, cfg: Any) -> str | None:
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


def _float_leaves(node: Any, prefix: str = "") -> list[tuple[str, float]]:
    """Every float value of a typed config, by its dotted key (the ``titan`` escape hatch's
    free-form values are torchtitan's to check)."""
    leaves = []
    for field in dataclasses.fields(node):
        value, key = getattr(node, field.name), f"{prefix}{field.name}"
        if dataclasses.is_dataclass(value):
            leaves += _float_leaves(value, f"{key}.")
        elif isinstance(value, float):
            leaves.append((key, value))
    return leaves


def range_problems(cfg: Any) -> list[ConfigError]:
    """A ``ConfigError`` for every float key that is not finite and every ranged key (``rules_of``)
    whose value is out of range."""
    rules = rules_of(cfg)
    problems = [
        ConfigError(key, f"must be a finite number, got {value}; {_hint(key, rules)}.")
        for key, value in _float_leaves(cfg)
        if not math.isfinite(value)
    ]
    not_finite = {error.key for error in problems}
    for key, rule in rules.items():
        value = lookup(cfg, key)
        if value is _MISSING or value is None or isinstance(value, bool) or key in not_finite:
            continue
        problem = violation(key, rule, value, cfg)
        if problem:
            problems.append(ConfigError(key, f"{problem}; valid: {describe(rule)}{_default_hint(key)}."))
    return problems


def _default_hint(key: str) -> str:
    default = _default(key)
    return f" (the default is {default})" if default not in (_MISSING, None) else ""


def _hint(key: str, rules: dict[str, Range]) -> str:
    rule = rules.get(key)
    valid = f"valid: {describe(rule)}" if rule else "give a finite number"
    return valid + _default_hint(key)


def check_ranges(cfg: Any) -> None:
    """A ``ConfigError`` naming every out-of-range or non-finite key (``range_problems``)."""
    problems = range_problems(cfg)
    if problems:
        raise grouped(problems)
