"""HF safetensors checkpoints checked against a model from their headers and a meta-device build,
so in preflight a wrong folder or size fails in a second with the tensors named, not deep inside
torchtitan's distributed checkpoint load.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from qwen3_trn.common.errors import ConfigError

# Keys a checkpoint may carry or lack without changing the model.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
_SHOW = 5


def safetensors_files(folder: str | Path) -> list[Path]:
    return sorted(Path(folder).glob("*.safetensors"))


def checkpoint_shapes(folder: str | Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """``{key: (shape, dtype)}`` of every tensor in the folder's safetensors files (headers only)."""
    from safetensors import safe_open

    shapes: dict[str, tuple[tuple[int, ...], str]] = {}
    for file in safetensors_files(folder):
        with safe_open(str(file), framework="pt") as handle:
            for key in handle.keys():
                part = handle.get_slice(key)
                shapes[key] = (tuple(part.get_shape()), str(part.get_dtype()))
    return shapes


def expected_shapes(hf_config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """``{HF key: shape}`` of the model Transformers builds from ``hf_config`` (on the meta device)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    values = {k: v for k, v in hf_config.items() if k != "model_type"}
    config = AutoConfig.for_model(hf_config["model_type"], **values)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    shapes = {key: tuple(t.shape) for key, t in model.state_dict().items()}
    if config.tie_word_embeddings:
        shapes.pop("lm_head.weight", None)
    return per_expert_layout(shapes)


def per_expert_layout(shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """Transformers v5 holds a Qwen3-MoE layer's experts as fused 3D tensors
    (``experts.gate_up_proj`` [E, 2I, H], ``experts.down_proj`` [E, H, I]) but reads and writes
    safetensors in the standard per-expert layout (``experts.{j}.gate_proj.weight`` [I, H], ...);
    checkpoints are compared in the latter."""
    out: dict[str, tuple[int, ...]] = {}
    for key, shape in shapes.items():
        if key.endswith(".experts.gate_up_proj"):
            prefix, (experts, two_i, hidden) = key[: -len("gate_up_proj")], shape
            for j in range(experts):
                out[f"{prefix}{j}.gate_proj.weight"] = (two_i // 2, hidden)
                out[f"{prefix}{j}.up_proj.weight"] = (two_i // 2, hidden)
        elif key.endswith(".experts.down_proj"):
            prefix, (experts, hidden, inter) = key[: -len("down_proj")], shape
            for j in range(experts):
                out[f"{prefix}{j}.down_proj.weight"] = (hidden, inter)
        else:
            out[key] = shape
    return out


def _listing(keys: list[str]) -> str:
    more = f" (and {len(keys) - _SHOW} more)" if len(keys) > _SHOW else ""
    return ", ".join(keys[:_SHOW]) + more


def compare_to_model(
    found: dict[str, tuple[int, ...]], expected: dict[str, tuple[int, ...]], tied: bool
) -> tuple[list[str], list[str], list[tuple[str, tuple[int, ...], tuple[int, ...]]]]:
    """(missing, unexpected, [(key, checkpoint shape, model shape)]) in the model's key order."""
    ignored = lambda key: key.endswith(_IGNORED_SUFFIXES) or (tied and key == "lm_head.weight")  # noqa: E731
    missing = [k for k in expected if k not in found and not ignored(k)]
    unexpected = [k for k in found if k not in expected and not ignored(k)]
    differ = [(k, found[k], expected[k]) for k in expected if k in found and tuple(found[k]) != tuple(expected[k])]
    return missing, unexpected, differ


def check_hf_checkpoint(folder: str, hf_config: dict[str, Any], key: str = "checkpoint.initial_load_path") -> None:
    """ConfigError unless ``folder`` holds HF safetensors that fit the model ``hf_config``
    describes; a DCP checkpoint (``.metadata``) is left to torchtitan's own loader."""
    path = Path(folder).expanduser()
    if not path.is_dir():
        raise ConfigError(key, f"'{folder}' is not a directory; pass the HF model directory holding model*.safetensors.")
    if (path / ".metadata").exists():
        return
    if not safetensors_files(path):
        present = sorted(p.name for p in path.iterdir())[:8]
        raise ConfigError(
            key,
            f"'{folder}' holds no *.safetensors files (found: {', '.join(present) or 'nothing'}); pass the Hugging Face "
            "model directory with the weights (model.safetensors or model-0000x-of-0000y.safetensors), "
            "e.g. one downloaded with `huggingface-cli download <id> --local-dir <dir>`.",
        )
    found = {k: shape for k, (shape, _) in checkpoint_shapes(path).items()}
    expected = expected_shapes(hf_config)
    missing, unexpected, differ = compare_to_model(found, expected, bool(hf_config.get("tie_word_embeddings")))
    arch = f"{hf_config['architectures'][0]} with {hf_config['num_hidden_layers']} layers, hidden size {hf_config['hidden_size']}"
    fix = (
        "Make the model match the checkpoint: point model.hf_model at the checkpoint's own config.json (or hub id) "
        "and use a model group without size overrides (e.g. model=0.6B / model=4B / model=30B-A3B rather than "
        "model=tiny), or fix the overrides (model.n_layers, model.dim, ...)."
    )
    if differ:
        shown = "; ".join(f"{k}: checkpoint {list(c)} vs model {list(m)}" for k, c, m in differ[:_SHOW])
        more = f" (and {len(differ) - _SHOW} more)" if len(differ) > _SHOW else ""
        raise ConfigError(key, f"the checkpoint in '{folder}' does not fit the model ({arch}): shapes differ for {shown}{more}. {fix}")
    fused = [k for k in found if k.endswith((".experts.gate_up_proj", ".experts.down_proj"))]
    if fused:
        raise ConfigError(
            key,
            f"the checkpoint in '{folder}' stores fused expert tensors ({fused[0]}, ...); backend=hf_v5 reads the "
            "standard per-expert Qwen3-MoE layout (mlp.experts.<j>.gate_proj.weight, ...). Re-save it with "
            "transformers: AutoModelForCausalLM.from_pretrained(dir).save_pretrained(new_dir).",
        )
    if missing:
        raise ConfigError(
            key,
            f"the checkpoint in '{folder}' lacks {len(missing)} tensor(s) the model ({arch}) has: {_listing(missing)}. {fix}",
        )
    if unexpected:
        raise ConfigError(
            key,
            f"the checkpoint in '{folder}' has {len(unexpected)} tensor(s) the model ({arch}) lacks: {_listing(unexpected)}. {fix}",
        )
