"""Qwen3 architecture <-> Hugging Face ``Qwen3Config`` / ``Qwen3MoeConfig``, for backend=hf_v5.

The HF config comes from the model group's flavor and overrides, or from ``model.hf_model`` with
the group's non-null overrides on top (as torchtitan's flavor overrides do). It is written once
to a content-addressed directory (``$QWEN3_TRN_CACHE/hf_configs/<hash>/``) that torchtitan's
transformers backend reads.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from qwen3_trn.common.errors import ConfigError
from qwen3_trn.config.files import read_json_file
from qwen3_trn.config.schema import ModelConfig
from qwen3_trn.models.architecture import FIELDS, Qwen3Architecture, fields_of, names_of
from qwen3_trn.results.records import cache_dir

DENSE_ARCHITECTURE = "Qwen3ForCausalLM"
MOE_ARCHITECTURE = "Qwen3MoeForCausalLM"
MODEL_TYPES = {DENSE_ARCHITECTURE: "qwen3", MOE_ARCHITECTURE: "qwen3_moe"}
# Qwen3's RMSNorm epsilon (torchtitan's ``_qwen3_norm`` and every released Qwen3 config).
RMS_NORM_EPS = 1e-6
KEY = "model.hf_model"

# HF config keys recomputed from the others when an override changes them.
_DERIVED_KEYS = ("layer_types", "transformers_version", "_name_or_path")
# Generic PretrainedConfig fields that ``to_dict`` adds and no Qwen3 config.json carries.
_GENERIC_KEYS = (
    "output_hidden_states",
    "output_attentions",
    "return_dict",
    "chunk_size_feed_forward",
    "is_encoder_decoder",
    "id2label",
    "label2id",
    "problem_type",
    "_name_or_path",
)


def hf_architecture_name(arch: Qwen3Architecture) -> str:
    return MOE_ARCHITECTURE if arch.is_moe else DENSE_ARCHITECTURE


def _config_class(architecture: str):
    from transformers import Qwen3Config, Qwen3MoeConfig

    return Qwen3MoeConfig if architecture == MOE_ARCHITECTURE else Qwen3Config


def hf_config_keys() -> tuple[str, ...]:
    """The top-level config.json keys ``architecture_from_hf`` reads."""
    keys = ["architectures", "model_type"]
    for field in FIELDS:
        for key in (field.hf, *field.hf_older) if field.hf else ():
            top = key.split(".")[0]
            if top not in keys:
                keys.append(top)
    return tuple(keys)


def _read(config: dict[str, Any], key: str) -> Any:
    """``config[key]`` (dotted: into nested dicts), None where absent."""
    value: Any = config
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _write(config: dict[str, Any], key: str, value: Any) -> None:
    """``config[key] = value`` (dotted: into a copy of the nested dict)."""
    head, _, rest = key.partition(".")
    if rest:
        config[head] = dict(config.get(head) or {})
        _write(config[head], rest, value)
    else:
        config[head] = value


def _drop(config: dict[str, Any], key: str) -> None:
    head, _, rest = key.partition(".")
    if not rest:
        config.pop(head, None)
    elif isinstance(config.get(head), dict) and rest in config[head]:
        config[head] = {k: v for k, v in config[head].items() if k != rest}


def hf_config_dict(arch: Qwen3Architecture, base: dict[str, Any] | None = None) -> dict[str, Any]:
    """The complete HF config.json for ``arch``, keeping ``base``'s other fields (token ids, rope
    scaling, dtype, ...)."""
    architecture = hf_architecture_name(arch)
    values: dict[str, Any] = {k: v for k, v in (base or {}).items() if k not in _DERIVED_KEYS}
    values.update(architectures=[architecture], model_type=MODEL_TYPES[architecture])
    if not values.get("rope_parameters"):
        values["rope_parameters"] = {"rope_type": "default"}
    for field in arch.fields():
        if field.hf:
            for older in field.hf_older:
                _drop(values, older)
            _write(values, field.hf, field.type(getattr(arch, field.name)))
    values.setdefault("rms_norm_eps", RMS_NORM_EPS)
    values.setdefault("hidden_act", "silu")
    values.setdefault("attention_bias", False)
    if arch.is_moe and base is None:
        # torchtitan's native Qwen3 MoE: every layer sparse, softmax router with the
        # top-k weights renormalised (route_norm=True), as in the released Qwen3 MoE configs.
        values.update(decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True)
        # Only layers listed in mlp_only_layers use a dense MLP; none here.
        values.setdefault("intermediate_size", arch.moe_hidden_dim)
    # Let Transformers fill and normalise the rest (layer_types, defaults, version).
    config = _config_class(architecture)(**{k: v for k, v in values.items() if k not in ("architectures", "model_type")})
    config.architectures = [architecture]
    out = config.to_dict()
    out["head_dim"] = arch.head_dim  # Qwen3MoeConfig has no head_dim field; its attention reads it when set
    for key in _GENERIC_KEYS:
        out.pop(key, None)
    return out


def check_qwen3(config: dict[str, Any], source: str) -> str:
    """The config's Qwen3 architecture class name; ConfigError if it names none or another model."""
    architectures = config.get("architectures")
    if not architectures:
        raise ConfigError(
            KEY,
            f"the config.json of '{source}' has no `architectures` list; torchtitan's transformers backend "
            f'picks the model class from it. Add "architectures": ["{DENSE_ARCHITECTURE}"] '
            f'(or ["{MOE_ARCHITECTURE}"] for a Qwen3 MoE) to that config.json.',
        )
    name = architectures[0]
    if name not in MODEL_TYPES:
        raise ConfigError(
            KEY,
            f"'{source}' is a {name} (model_type '{config.get('model_type')}'), not Qwen3; backend=hf_v5 trains "
            f"{DENSE_ARCHITECTURE} and {MOE_ARCHITECTURE} only. Point model.hf_model at a Qwen3 model "
            "(e.g. Qwen/Qwen3-0.6B, Qwen/Qwen3-30B-A3B) or unset it to build the config from the model group.",
        )
    return name


def architecture_from_hf(config: dict[str, Any], source: str) -> Qwen3Architecture:
    kind = "moe" if check_qwen3(config, source) == MOE_ARCHITECTURE else "dense"
    values: dict[str, Any] = {}
    for field in fields_of(kind):
        keys = (field.hf, *field.hf_older) if field.hf else ()
        value = next((v for v in (_read(config, key) for key in keys) if v is not None), None)
        if value is None:
            if field.hf_default is None:
                raise KeyError(field.hf)
            value = field.hf_default(values) if callable(field.hf_default) else field.hf_default
        values[field.name] = field.type(value)
    return Qwen3Architecture(**values)


def _looks_local(hf_model: str) -> bool:
    """Paths that cannot be a hub id ("org/name" or "name")."""
    return hf_model.startswith((".", "/", "~")) or hf_model.count("/") > 1


def load_hf_config(hf_model: str) -> dict[str, Any]:
    """``config.json`` of a local directory or hub id, checked to be Qwen3. Hub ids go through
    Transformers, so the HF cache and ``HF_HUB_OFFLINE`` apply."""
    path = Path(hf_model).expanduser()
    if path.is_dir():
        config_file = path / "config.json"
        if not config_file.is_file():
            raise ConfigError(
                KEY,
                f"'{hf_model}' is a local directory but holds no config.json; put the model's HF config.json "
                "there (its `architectures` must name Qwen3ForCausalLM or Qwen3MoeForCausalLM), or pass a hub id.",
            )
        config = read_json_file(config_file, KEY, "config.json")
    elif path.exists():
        raise ConfigError(KEY, f"'{hf_model}' is a file, not a directory; pass the directory that holds config.json, or a hub id.")
    else:
        if _looks_local(hf_model):
            raise ConfigError(
                KEY,
                f"'{hf_model}' is neither a local directory (no such path) nor a hub id; pass a directory holding "
                "config.json or a hub id such as Qwen/Qwen3-0.6B.",
            )
        try:
            from transformers import PretrainedConfig

            config, _ = PretrainedConfig.get_config_dict(hf_model)
        except Exception as exc:  # OSError, EnvironmentError, HF hub errors, invalid repo id
            offline = " (HF_HUB_OFFLINE is set, so only the local HF cache was searched)" if os.environ.get("HF_HUB_OFFLINE") else ""
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ConfigError(
                KEY,
                f"'{hf_model}' is not a local directory (no such path) and is not a reachable hub id{offline}: {reason}. "
                "Pass a local directory holding config.json, or a hub id that resolves (check spelling, network and "
                "HF_TOKEN for gated models).",
            ) from exc
    check_qwen3(config, hf_model)
    return config


def apply_model_overrides(base: Qwen3Architecture, model: ModelConfig, source: str) -> Qwen3Architecture:
    """``base`` (read from an HF config) with the model group's non-null architecture keys."""
    requested = base.requested_overrides(model)
    wrong_kind = base.keys_of_other_kind(requested)
    if wrong_kind:
        key = wrong_kind[0]
        if base.is_moe:
            message = (
                f"'{source}' is a Qwen3 MoE ({MOE_ARCHITECTURE}) but model.{key} is set (model={model.flavor} sets it); "
                f"{key} applies to dense models. Use an MoE model group (model=tiny_moe, model=30B-A3B) or model.{key}=null."
            )
        else:
            message = (
                f"'{source}' is a dense Qwen3 ({DENSE_ARCHITECTURE}) but model.{key} is set (model={model.flavor} sets it); "
                f"{names_of('moe')} apply to MoE models. Use a dense model group (model=tiny, model=0.6B) "
                f"or model.{key}=null."
            )
        raise ConfigError(f"model.{key}", message)
    return base.replaced(requested)


def hf_model_architecture(model: ModelConfig) -> Qwen3Architecture:
    """The architecture of ``model.hf_model`` with the model group's overrides applied."""
    assert model.hf_model
    return apply_model_overrides(architecture_from_hf(load_hf_config(model.hf_model), model.hf_model), model, model.hf_model)


def _cache_root() -> Path:
    return cache_dir() / "hf_configs"


def write_hf_config_dir(config: dict[str, Any], root: Path | None = None) -> Path:
    """A directory holding exactly ``config`` as config.json, named by its content's hash so that
    preflight, ranks and later runs share it; written atomically."""
    text = json.dumps(config, indent=2, sort_keys=True) + "\n"
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    root = Path(root) if root is not None else _cache_root()
    target = root / f"{config.get('model_type', 'qwen3')}-{digest}"
    if (target / "config.json").is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=root, prefix=".tmp-"))
    (staging / "config.json").write_text(text)
    try:
        os.rename(staging, target)
    except OSError:  # another process won the race; its content is identical
        (staging / "config.json").unlink(missing_ok=True)
        staging.rmdir()
    return target
