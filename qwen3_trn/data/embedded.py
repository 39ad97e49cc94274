"""Locations of the text corpus and tokenizer shipped inside ``qwen3_trn``.

The files live in ``qwen3_trn/data/assets/`` (built by
``python -m qwen3_trn.data.build_assets``). If they were removed,
:func:`ensure_assets` rebuilds them once into a cache directory
(``$QWEN3_TRN_CACHE`` or ``~/.cache/qwen3_trn``) and returns that directory.
Without an explicit ``root`` the path helpers use :func:`assets_root`: the packaged
directory when complete, else a complete cache, so call :func:`ensure_assets` once
at start-up and the helpers follow it::

    ensure_assets()
    load_dataset("json", data_files=str(corpus_path()), split="train")
    HuggingFaceTokenizer(tokenizer_path=str(tokenizer_dir()))

Load the corpus files by name (``data_files=``), not by handing ``datasets`` the
assets directory: its split inference would read ``corpus_val`` as the only split.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from qwen3_trn.data.build_assets import (
    CORPUS_FILE,
    DEFAULT_ASSETS_DIR,
    TOKENIZER_SUBDIR,
    VAL_CORPUS_FILE,
)

PACKAGED_ASSETS_DIR: Path = DEFAULT_ASSETS_DIR
_REQUIRED = (
    CORPUS_FILE,
    VAL_CORPUS_FILE,
    f"{TOKENIZER_SUBDIR}/tokenizer.json",
    f"{TOKENIZER_SUBDIR}/tokenizer_config.json",
)


def assets_root() -> Path:
    """The packaged assets directory if complete, else a complete rebuilt cache, else the former.

    Never builds anything; see :func:`ensure_assets`.
    """
    if missing_assets(PACKAGED_ASSETS_DIR):
        cached = cache_dir() / "assets"
        if not missing_assets(cached):
            return cached
    return PACKAGED_ASSETS_DIR


def corpus_path(root: Path | None = None) -> Path:
    """Training corpus: gzip'd JSON lines, one ``{"text": ...}`` document per line."""
    return (root or assets_root()) / CORPUS_FILE


def validation_corpus_path(root: Path | None = None) -> Path:
    """Held-out documents (~2%), same format as :func:`corpus_path`."""
    return (root or assets_root()) / VAL_CORPUS_FILE


def tokenizer_dir(root: Path | None = None) -> Path:
    """Directory with ``tokenizer.json`` and ``tokenizer_config.json`` (vocab size 2048)."""
    return (root or assets_root()) / TOKENIZER_SUBDIR


def cache_dir() -> Path:
    """Where missing assets are rebuilt: ``$QWEN3_TRN_CACHE`` or ``~/.cache/qwen3_trn``."""
    env = os.environ.get("QWEN3_TRN_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "qwen3_trn"


def missing_assets(root: Path) -> list[str]:
    """Required asset files absent (or empty) under ``root``."""
    return [rel for rel in _REQUIRED if not (root / rel).is_file() or (root / rel).stat().st_size == 0]


def ensure_assets() -> Path:
    """Return a directory holding every asset: the packaged one, else a rebuilt cache.

    The rebuild runs ``python -m qwen3_trn.data.build_assets`` in a subprocess (so the
    caller's process imports nothing extra) into a temporary directory that is renamed
    into place, so concurrent callers (e.g. several ranks) never see partial files.
    """
    if not missing_assets(PACKAGED_ASSETS_DIR):
        return PACKAGED_ASSETS_DIR
    target = cache_dir() / "assets"
    if not missing_assets(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="assets.tmp-", dir=target.parent))
    tmp.chmod(0o755)
    try:
        subprocess.run(
            [sys.executable, "-m", "qwen3_trn.data.build_assets", "--out", str(tmp)],
            check=True,
            stdout=subprocess.DEVNULL,
            env=_subprocess_env(),
        )
        if target.exists() and missing_assets(target):
            shutil.rmtree(target, ignore_errors=True)  # an incomplete leftover
        try:
            os.rename(tmp, target)
        except OSError:
            if missing_assets(target):  # lost a race to a broken writer: surface it
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if missing := missing_assets(target):
        raise FileNotFoundError(f"asset rebuild into {target} left out {missing}")
    return target


def _subprocess_env() -> dict[str, str]:
    """Environment for the rebuild: this checkout's ``qwen3_trn`` first on ``PYTHONPATH``."""
    package_root = str(Path(__file__).resolve().parents[2])
    path = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path}
