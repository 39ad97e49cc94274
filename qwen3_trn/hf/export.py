"""Hugging Face model folders from any training mode (``checkpoint=hf_export``, docs/export.md),
written through the mode's own state-dict adapter and torchtitan's HF safetensors writer. Replaces
torchtitan's ``last_save_in_hf``, which writes only the safetensors, into the DCP checkpoint folder.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from qwen3_trn.checkpointing import GuardedCheckpointManager
from qwen3_trn.common.errors import ConfigError
from qwen3_trn.config.schema import CheckpointConfig
from qwen3_trn.titan import MODEL, TORCH_DTYPE_MAP, AsyncMode, logger, replaces_checkpoint_save

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "generation_config.json",
)
STAGING_SUFFIX = ".partial"


def check_hf_export(checkpoint: CheckpointConfig) -> None:
    """ConfigErrors for the export keys, before any worker starts."""
    if checkpoint.export_dtype not in TORCH_DTYPE_MAP:
        raise ConfigError("checkpoint.export_dtype", f"'{checkpoint.export_dtype}' is not one of {', '.join(TORCH_DTYPE_MAP)}.")
    if checkpoint.hf_interval < 0:
        raise ConfigError("checkpoint.hf_interval", f"must be >= 0 (0: export at the last step only), got {checkpoint.hf_interval}.")
    if checkpoint.hf_export and not checkpoint.hf_folder.strip():
        raise ConfigError("checkpoint.hf_folder", "must name a folder inside the run directory, e.g. checkpoint.hf_folder=hf.")


def _special_token_ids(tokenizer_dir: str | Path | None) -> dict[str, int]:
    if tokenizer_dir is None or not (Path(tokenizer_dir) / "tokenizer_config.json").is_file():
        return {}
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    ids = {name: getattr(tokenizer, name) for name in ("bos_token_id", "eos_token_id", "pad_token_id")}
    return {name: value for name, value in ids.items() if value is not None}


def write_hf_model_files(folder: str | Path, hf_config: dict[str, Any], tokenizer_dir: str | Path | None, dtype: str) -> None:
    """Complete a folder of HF safetensors into a directory ``from_pretrained`` loads:
    config.json (with the dtype the weights were written in), tokenizer files and
    generation_config.json (the tokenizer's own if it ships one)."""
    from transformers import GenerationConfig

    folder = Path(folder)
    staging = folder / "sharded"  # torchtitan's per-rank files, already consolidated into folder
    if staging.is_dir() and any(folder.glob("*.safetensors")):
        shutil.rmtree(staging)
    config = dict(hf_config)
    for name, value in _special_token_ids(tokenizer_dir).items():
        if config.get(name) is None:
            config[name] = value
    config["dtype"] = dtype
    config.pop("torch_dtype", None)
    config["use_cache"] = True
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    if tokenizer_dir is not None:
        for name in TOKENIZER_FILES:
            source = Path(tokenizer_dir) / name
            if source.is_file() and not (folder / name).exists():
                shutil.copyfile(source, folder / name)
    if not (folder / "generation_config.json").exists():
        ids = {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if config.get(k) is not None}
        GenerationConfig(**ids).save_pretrained(str(folder))


def latest_hf_export(folder: str | Path | None) -> Path | None:
    """The highest complete ``step-N`` model folder under ``folder`` (None when there is none)."""
    root = Path(folder) if folder else None
    if root is None or not root.is_dir():
        return None
    steps = []
    for path in root.glob("step-*"):
        number = path.name.removeprefix("step-")
        if number.isdigit() and (path / "config.json").is_file():
            steps.append((int(number), path))
    return max(steps)[1] if steps else None


@torch.no_grad()
def save_hf_weights(checkpointer: GuardedCheckpointManager, folder: str | Path, dtype: str) -> None:
    """The model's weights in ``dtype`` as HF safetensors in ``folder``, through the checkpointer's
    state-dict adapter and torchtitan's HF writer (collective: every rank calls it)."""
    target = TORCH_DTYPE_MAP[dtype]
    states = {
        key: value.to(target) if isinstance(value, torch.Tensor) and value.is_floating_point() else value
        for key, value in checkpointer.states[MODEL].state_dict().items()
    }
    checkpointer.dcp_save(states, checkpoint_id=str(folder), async_mode=AsyncMode.DISABLED, enable_garbage_collection=True, to_hf=True)


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


@replaces_checkpoint_save
class HFExportCheckpointManager(GuardedCheckpointManager):
    @dataclass(kw_only=True, slots=True)
    class Config(GuardedCheckpointManager.Config):
        dcp: bool = True
        """DCP checkpoints (checkpoint.enable); False when ``enable`` is on for the HF export alone."""

        hf_export: bool = False
        """Write Hugging Face model folders (at the last step, and every ``hf_interval`` steps if > 0)."""

        hf_interval: int = 0

        hf_folder: str = "hf"
        """Relative to the run directory: <run dir>/<hf_folder>/step-N."""

        hf_config: dict[str, Any] = field(default_factory=dict)
        """The model's Hugging Face config.json."""

        tokenizer_dir: str | None = None
        """Tokenizer files copied into every export."""

    def __init__(self, config: Config, *, base_folder: str = "", **kwargs: Any) -> None:
        super().__init__(config, base_folder=base_folder, **kwargs)
        if not self.enable:
            return
        self.write_dcp = config.dcp
        self.hf_export = config.hf_export
        self.hf_interval = config.hf_interval
        self.hf_root = Path(base_folder) / config.hf_folder
        self.hf_config = config.hf_config
        self.tokenizer_dir = config.tokenizer_dir
        self.hf_dtype = config.export_dtype
        if self.hf_export and self.sd_adapter is None:
            raise ValueError("checkpoint.hf_export needs the model's state-dict adapter, and this model spec has none.")

    def _save(self, curr_step: int, last_step: bool = False) -> bool:
        saved = super()._save(curr_step, last_step) if self.write_dcp else False
        if self.hf_export and (last_step or (self.hf_interval > 0 and curr_step % self.hf_interval == 0)):
            self.save_hf_model(curr_step)
            saved = True
        return saved

    def save_hf_model(self, step: int) -> Path:
        """Write <hf_folder>/step-<step> (collective: every rank calls it)."""
        target = self.hf_root / f"step-{step}"
        staging = self.hf_root / f".step-{step}{STAGING_SUFFIX}"
        if _rank() == 0:
            shutil.rmtree(staging, ignore_errors=True)  # a leftover of an interrupted export
            self.hf_root.mkdir(parents=True, exist_ok=True)
        _barrier()
        save_hf_weights(self, staging, self.hf_dtype)
        _barrier()
        if _rank() == 0:
            write_hf_model_files(staging, self.hf_config, self.tokenizer_dir, self.hf_dtype)
            if target.exists():  # the same step exported again (a resumed run)
                shutil.rmtree(target)
            os.rename(staging, target)
            logger.info(f"Hugging Face model folder written: {target}")
        _barrier()
        return target
