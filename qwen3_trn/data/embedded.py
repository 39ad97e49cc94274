"""The text corpus and tokenizer shipped in ``qwen3_trn/data/assets/`` (built by
``python tools/build_assets.py``)::

    load_dataset("json", data_files=str(corpus_path()), split="train")
    HuggingFaceTokenizer(tokenizer_path=str(tokenizer_dir()))

Load the corpus by file name: given the directory, ``datasets`` infers ``corpus_val`` as the
only split.
"""

from __future__ import annotations

from pathlib import Path

PACKAGED_ASSETS_DIR = Path(__file__).resolve().parent / "assets"
CORPUS_FILE = "corpus.jsonl.gz"
VAL_CORPUS_FILE = "corpus_val.jsonl.gz"
TOKENIZER_SUBDIR = "tokenizer"
_REQUIRED = (
    CORPUS_FILE,
    VAL_CORPUS_FILE,
    f"{TOKENIZER_SUBDIR}/tokenizer.json",
    f"{TOKENIZER_SUBDIR}/tokenizer_config.json",
)


class MissingAssetsError(FileNotFoundError):
    """The installed package lacks its shipped corpus or tokenizer (a broken install)."""


def corpus_path(root: Path = PACKAGED_ASSETS_DIR) -> Path:
    """Training corpus: gzip'd JSON lines, one ``{"text": ...}`` document per line."""
    return root / CORPUS_FILE


def validation_corpus_path(root: Path = PACKAGED_ASSETS_DIR) -> Path:
    """Held-out documents (~2%), same format as :func:`corpus_path`."""
    return root / VAL_CORPUS_FILE


def tokenizer_dir(root: Path = PACKAGED_ASSETS_DIR) -> Path:
    """Directory with ``tokenizer.json`` and ``tokenizer_config.json`` (vocab size 2048)."""
    return root / TOKENIZER_SUBDIR


def missing_assets(root: Path) -> list[str]:
    """Required asset files absent (or empty) under ``root``."""
    return [rel for rel in _REQUIRED if not (root / rel).is_file() or (root / rel).stat().st_size == 0]


def ensure_assets(root: Path = PACKAGED_ASSETS_DIR) -> Path:
    """``root``; raises ``MissingAssetsError`` naming what is missing."""
    missing = missing_assets(root)
    if missing:
        raise MissingAssetsError(
            f"the shipped training assets are missing from {root}: {', '.join(missing)}. Reinstall qwen3_trn, "
            "or rebuild them from a checkout with `python tools/build_assets.py`."
        )
    return root
