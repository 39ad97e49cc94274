"""What the run's inputs hold, checked in the parent before any worker starts (that the paths
exist is checked earlier: ``config.paths``).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable

from qwen3_trn.common.errors import ConfigError, first_line
from qwen3_trn.common.quiet import logging_disabled
from qwen3_trn.config.files import read_json_file
from qwen3_trn.config.schema import RunConfig
from qwen3_trn.data.sources import data_source

# ------------------------------------------------------------------------------------------
# Data
# ------------------------------------------------------------------------------------------


def check_data(cfg: RunConfig) -> None:
    """The data source's own checks: its data opened and its first records read."""
    data_source(cfg.data).check(cfg.mode)


# ------------------------------------------------------------------------------------------
# Tokenizer and HF files
# ------------------------------------------------------------------------------------------

TOKENIZER_KEY = "model.hf_assets_path"
JSON_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "special_tokens_map.json", "config.json")


def check_tokenizer(path: str | Path, build: Callable[[str], Any], vocab_size: int) -> None:
    """``build(path)`` is the tokenizer the ranks build (torchtitan's, from the Trainer.Config)."""
    path = Path(path)
    if not path.is_dir():
        raise ConfigError(TOKENIZER_KEY, f"'{path}' is not a directory; point it at a folder holding tokenizer.json (HF assets).")
    if not any((path / name).is_file() for name in ("tokenizer.json", "vocab.json", "vocab.txt")):
        raise ConfigError(
            TOKENIZER_KEY,
            f"'{path}' holds no tokenizer (no tokenizer.json or vocab.json); download the model's HF assets "
            "there, or leave model.hf_assets_path unset to use the tokenizer the project ships.",
        )
    parsed = {name: read_json_file(path / name, TOKENIZER_KEY, name) for name in JSON_FILES if (path / name).is_file()}
    try:
        with logging_disabled(logging.CRITICAL):
            tokenizer = build(str(path))
    except Exception as exc:  # noqa: BLE001 - the tokenizers library's own errors
        raise ConfigError(
            TOKENIZER_KEY,
            f"torchtitan cannot load the tokenizer in '{path}': {first_line(exc)}; replace its tokenizer files with the model's own.",
        ) from None
    vocab = tokenizer.tokenizer.get_vocab(with_added_tokens=True) if hasattr(tokenizer, "tokenizer") else {}
    size = max(vocab.values()) + 1 if vocab else tokenizer.get_vocab_size()
    if size > vocab_size:
        raise ConfigError(
            "model.vocab_size",
            f"the tokenizer in '{path}' has {size} tokens but the model's vocab_size is {vocab_size}; "
            f"set model.vocab_size>={size} or use a matching tokenizer.",
        )
    declared = (parsed.get("config.json") or {}).get("vocab_size") if isinstance(parsed.get("config.json"), dict) else None
    if isinstance(declared, int) and declared < size:
        raise ConfigError(
            TOKENIZER_KEY,
            f"{path / 'config.json'} says vocab_size {declared}, but the tokenizer there has {size} tokens; "
            "the two files come from different models: use the model's own files.",
        )
