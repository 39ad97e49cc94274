"""Training modes selectable with ``backend=<name>``: how a composed config becomes the model
torchtitan trains (``native``, ``hf_v5``, ``nki_moe``), each a ``Backend`` in ``BACKENDS``."""

from qwen3_trn.backends.base import Backend
from qwen3_trn.backends.hf_v5 import HF_V5
from qwen3_trn.backends.native import NATIVE
from qwen3_trn.backends.nki_moe import NKI_MOE
from qwen3_trn.errors import ConfigError

BACKENDS: dict[str, Backend] = {backend.name: backend for backend in (NATIVE, HF_V5, NKI_MOE)}


def get_backend(name: str) -> Backend:
    if name not in BACKENDS:
        raise ConfigError("backend.name", f"unknown backend '{name}'; use one of {', '.join(BACKENDS)}.")
    return BACKENDS[name]


__all__ = ["Backend", "BACKENDS", "get_backend"]
