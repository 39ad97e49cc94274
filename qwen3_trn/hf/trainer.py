"""torchtitan's transformers-backend trainer, with the HF checkpoint story completed.

``Qwen3HFTrainer`` is ``HFTransformerTrainer`` (torchtitan/experiments/transformers_modeling_backend)
with its uninitialised buffers fixed and native Qwen3's initialisation (``qwen3_trn.hf.model``), and two additions
about Hugging Face checkpoints:

* ``checkpoint.initial_load_path`` pointing at a folder of ``*.safetensors`` (and no DCP
  ``.metadata``) is read as HF weights (``initial_load_in_hf``), so fine-tuning from released
  weights needs only the path.
* after a run whose last save is in HF format (``checkpoint.last_save_in_hf``), rank 0 adds
  the model's ``config.json`` (and the tokenizer files) to that step folder, so
  ``transformers.AutoModelForCausalLM.from_pretrained(<folder>)`` loads it. torchtitan writes
  only the safetensors.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from torchtitan.experiments.transformers_modeling_backend.configs import TransformersBackendConfig
from torchtitan.experiments.transformers_modeling_backend.trainer import HFTransformerTrainer
from torchtitan.tools.logging import logger

from qwen3_trn.hf.model import init_like_native, reset_unset_buffers
from qwen3_trn.records import write_json_atomic

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "generation_config.json",
)


def is_hf_weights_dir(path: str | Path) -> bool:
    """A folder of HF safetensors (not a DCP checkpoint, which has a .metadata file)."""
    folder = Path(path)
    return folder.is_dir() and not (folder / ".metadata").exists() and any(folder.glob("*.safetensors"))


def write_hf_export_files(folder: str | Path, hf_config_dir: str | Path, tokenizer_dir: str | Path | None, dtype: str) -> None:
    """Complete a folder of HF safetensors into a directory ``from_pretrained`` loads."""
    folder = Path(folder)
    staging = folder / "sharded"  # torchtitan's per-rank files, already consolidated into folder
    if staging.is_dir() and any(folder.glob("*.safetensors")):
        shutil.rmtree(staging)
    config = json.loads((Path(hf_config_dir) / "config.json").read_text())
    config["dtype"] = dtype  # the dtype the safetensors were written in (checkpoint.export_dtype)
    config.pop("torch_dtype", None)
    config["use_cache"] = True
    write_json_atomic(folder / "config.json", config, sort_keys=True)
    if tokenizer_dir is not None:
        for name in TOKENIZER_FILES:
            source = Path(tokenizer_dir) / name
            if source.is_file() and not (folder / name).exists():
                shutil.copyfile(source, folder / name)


class Qwen3HFTrainer(HFTransformerTrainer):
    @dataclass(kw_only=True, slots=True)
    class Config(TransformersBackendConfig):
        def __post_init__(self) -> None:
            ckpt = self.checkpoint
            if ckpt.initial_load_path and ckpt.initial_load_model_only and is_hf_weights_dir(ckpt.initial_load_path):
                ckpt.initial_load_in_hf = True
            TransformersBackendConfig.__post_init__(self)

    def __init__(self, config: "Qwen3HFTrainer.Config") -> None:
        super().__init__(config)
        for part in self.model_parts:
            reset_unset_buffers(part)
        # Start from native Qwen3's initialisation (a checkpoint loaded in train() replaces it).
        for part in self.model_parts:
            uncovered = init_like_native(part, self.model_config.num_hidden_layers, self.model_config.is_moe)
            if uncovered:
                logger.warning(f"Kept torchtitan's HF initialisation for {uncovered}")

    def train(self) -> None:
        super().train()
        self._complete_hf_export()

    def _complete_hf_export(self) -> None:
        ckpt = self.config.checkpoint
        if not (ckpt.enable and ckpt.last_save_in_hf and self.step == self.config.training.steps):
            return
        if torch.distributed.is_initialized() and torch.distributed.get_rank() != 0:
            return
        folder = Path(self.checkpointer._create_checkpoint_id(self.step))
        if not folder.is_dir():
            logger.warning(f"No HF export folder at {folder}; config.json not written.")
            return
        write_hf_export_files(folder, self.config.hf_model, self.config.hf_assets_path, ckpt.export_dtype)
        logger.info(f"Hugging Face model directory complete: {folder}")
