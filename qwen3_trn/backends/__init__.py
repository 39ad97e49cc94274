"""Training modes selectable with ``backend=<name>``: how a composed config becomes the model
torchtitan trains. Each is a ``Backend`` class (its ``Config``: ``qwen3_trn.config.option_schemas``) in a module of this
package (``native``, ``hf_v5``, ``nki_moe``); importing the package imports every module, so
each option registers itself in ``BackendConfig.options``, and ``cfg.backend.build()`` makes it:
once per process (preflight in the parent, the worker in a rank), then handed on.
A new mode is one module here plus its ``conf/backend/<name>.yaml``."""

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
    """The backend of the run's ``backend`` option (its ``Config.build()``)."""
    _known(config.name)
    return config.build()


__all__ = ["Backend", "build_backend"]
