"""torchtitan-neuron's NKI MoE recipe as the model of ``backend=nki_moe backend.kernels=torchtitan_neuron``.

The seed article (/work/shared/seed/, "AWS Trainium 三种方式训练 Qwen3", third recipe) calls::

    from torchtitan_neuron.models.qwen3.config_registry import qwen3_nki_moe_config
    config = qwen3_nki_moe_config("30B-A3B", compile_config=CompileConfig(enable=False, backend="neuron"),
                                  n_layers=4, num_experts=64, top_k=4)   # a Trainer.Config

The project calls it with its own values and trains ``config.model_spec``. Its source was not
found, so the signature is checked against the article's before the call, and the model it
returns against the project's architecture (a difference is refused).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from typing import Any, Callable

from qwen3_trn.common.errors import ConfigError
from qwen3_trn.config.schema import CompileConfig, RunConfig
from qwen3_trn.models.architecture import Qwen3Architecture
from qwen3_trn.titan import CompileConfig as TitanCompileConfig
from qwen3_trn.titan import ModelSpec

RECIPE_MODULE = "torchtitan_neuron.models.qwen3.config_registry"
RECIPE_FUNCTION = "qwen3_nki_moe_config"
RECIPE = f"{RECIPE_MODULE}.{RECIPE_FUNCTION}"
# The seed article's call: the flavor by position, these by keyword.
RECIPE_KEYWORDS = ("compile_config", "n_layers", "num_experts", "top_k")
# torch.compile's backend on Neuron (torch-neuronx registers it), as the article passes it.
NEURON_COMPILE_BACKEND = "neuron"

KEY = "backend.kernels"


def recipe() -> Callable[..., Any] | None:
    """AWS's ``qwen3_nki_moe_config``, or None where torchtitan-neuron does not provide it."""
    try:
        return getattr(importlib.import_module(RECIPE_MODULE), RECIPE_FUNCTION)
    except (ImportError, AttributeError):
        return None


def signature_problem(function: Callable[..., Any]) -> str | None:
    """Why ``function`` cannot be called as the article calls it, or None."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError) as exc:
        return f"its signature cannot be read ({exc})"
    parameters = list(signature.parameters.values())
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    by_keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    problems = []
    if not parameters or parameters[0].kind not in positional:
        problems.append("its first parameter is not the positional model flavor")
    for name in RECIPE_KEYWORDS:
        parameter = signature.parameters.get(name)
        if parameter is None or parameter.kind not in by_keyword:
            problems.append(f"it takes no keyword parameter {name!r}")
    filled = {parameters[0].name, *RECIPE_KEYWORDS} if parameters else set(RECIPE_KEYWORDS)
    for parameter in parameters:
        if parameter.name not in filled and parameter.default is inspect.Parameter.empty and parameter.kind in (*positional, *by_keyword):
            problems.append(f"it requires {parameter.name!r}, which the article's call does not pass")
    if not problems:
        return None
    return f"{RECIPE}{signature} differs from the call the project makes: " + "; ".join(problems)


def unavailable_reason() -> str | None:
    """None when AWS's recipe can be called as the article does, else why not."""
    function = recipe()
    if function is None:
        return f"{RECIPE} does not import (torchtitan-neuron is not installed here)"
    return signature_problem(function)


def recipe_compile_config(compile: CompileConfig) -> TitanCompileConfig:
    """The project's compile settings as the article's argument (off: ``enable=False`` with
    Neuron's backend named)."""
    enabled = compile.backend != "off"
    return TitanCompileConfig(
        enable=enabled,
        backend=str(compile.backend) if enabled else NEURON_COMPILE_BACKEND,
        components=[str(component) for component in compile.components],
    )


def recipe_arguments(cfg: RunConfig, arch: Qwen3Architecture) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The article's arguments, from the project's config: ``(flavor,)`` and the keywords."""
    return (cfg.model.flavor,), dict(
        compile_config=recipe_compile_config(cfg.compile),
        n_layers=arch.n_layers,
        num_experts=arch.num_experts,
        top_k=arch.top_k,
    )


def recipe_model_spec(cfg: RunConfig, arch: Qwen3Architecture) -> ModelSpec:
    """``qwen3_nki_moe_config(...).model_spec``, refused where it is not the model ``arch`` describes."""
    reason = unavailable_reason()
    if reason is not None:
        raise ConfigError(KEY, f"kernels=torchtitan_neuron cannot run: {reason}. Use backend.kernels=nki or portable.")
    args, kwargs = recipe_arguments(cfg, arch)
    trainer_config = recipe()(*args, **kwargs)
    spec = getattr(trainer_config, "model_spec", None)
    if not isinstance(spec, ModelSpec):
        raise ConfigError(
            KEY,
            f"{RECIPE} returned a {type(trainer_config).__name__} without a torchtitan ModelSpec in model_spec; use backend.kernels=nki.",
        )
    try:
        built = Qwen3Architecture.of_model_config(spec.model)
    except (AttributeError, IndexError, TypeError) as exc:
        raise ConfigError(
            KEY, f"the model {RECIPE} builds is not laid out as torchtitan's Qwen3 ({exc}); use backend.kernels=nki."
        ) from exc
    differences = [
        f"{field.name}={getattr(built, field.name)} (the project's {getattr(arch, field.name)})"
        for field in dataclasses.fields(arch)
        if getattr(built, field.name) != getattr(arch, field.name)
    ]
    if differences:
        raise ConfigError(
            KEY,
            f"{RECIPE}({args[0]!r}, n_layers={arch.n_layers}, num_experts={arch.num_experts}, top_k={arch.top_k}) "
            f"builds a model with {', '.join(differences)}; the project sizes, checks and exports model={cfg.model.flavor} "
            "with its overrides, so it does not train another. Use backend.kernels=nki.",
        )
    return spec
