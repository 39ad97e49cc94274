"""Training modes, chosen by ``backend=<name>``: how a config becomes the model torchtitan trains.

Each module defines a ``Backend``; importing the package registers them all. ``cfg.backend.build()``
makes one once per process. A new mode is one module here and its ``conf/backend/<name>.yaml``.
"""

from qwen3_trn.backends.base import Backend
from qwen3_trn.common.errors import ConfigError
from qwen3_trn.config.options import import_submodules
from qwen3_trn.config.schema import BackendConfig

import_submodules(__name__, __path__)


def _known(name: str) -> type[BackendConfig]:
    if name not in BackendConfig.options:
        raise ConfigError("backend.name", f"unknown backend '{name}'; use one of {', '.join(BackendConfig.options)}.")
    return BackendConfig.options[name]


def build_backend(config: BackendConfig) -> Backend:
    _known(config.name)
    return config.build()


__all__ = ["Backend", "build_backend"]
