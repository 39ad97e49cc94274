"""Training modes selectable with ``backend=<name>``: how a composed config becomes the model
torchtitan trains (``native``, ``hf_v5``, ``nki_moe``), each a ``Backend`` class in ``BACKENDS``,
built from its option's config (``cfg.backend.build()``)."""

from qwen3_trn.backends.base import Backend
from qwen3_trn.backends.hf_v5 import HfV5Backend
from qwen3_trn.backends.native import NativeBackend
from qwen3_trn.backends.nki_moe import NkiMoeBackend
from qwen3_trn.config.schema import BackendConfig
from qwen3_trn.errors import ConfigError

BACKENDS: dict[str, type[Backend]] = {cls.option_name(): cls for cls in (NativeBackend, HfV5Backend, NkiMoeBackend)}


def build_backend(config: BackendConfig) -> Backend:
    """The backend of the run's ``backend`` option (its ``Config.build()``)."""
    if config.name not in BACKENDS:
        raise ConfigError("backend.name", f"unknown backend '{config.name}'; use one of {', '.join(BACKENDS)}.")
    return config.build()


def backend_named(name: str) -> Backend:
    """The backend ``backend=<name>`` selects, with that option's defaults."""
    if name not in BACKENDS:
        raise ConfigError("backend.name", f"unknown backend '{name}'; use one of {', '.join(BACKENDS)}.")
    return BACKENDS[name].Config().build()


__all__ = ["Backend", "BACKENDS", "backend_named", "build_backend"]
