"""torchtitan's ``HFTransformerTrainer`` with its uninitialised buffers fixed and native Qwen3's
initialisation (``qwen3_trn.hf.model``). A ``checkpoint.initial_load_path`` folder of
``*.safetensors`` is read as HF weights, so fine-tuning from released weights needs only the path.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from qwen3_trn.hf.model import init_like_native, reset_unset_buffers
from qwen3_trn.titan import HFTransformerTrainer, TransformersBackendConfig, logger


def is_hf_weights_dir(path: str | Path) -> bool:
    """A folder of HF safetensors (not a DCP checkpoint, which has a .metadata file)."""
    folder = Path(path)
    return folder.is_dir() and not (folder / ".metadata").exists() and any(folder.glob("*.safetensors"))


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
