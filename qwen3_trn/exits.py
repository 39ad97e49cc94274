"""The exit status of ``python -m qwen3_trn``: 0 done, 2 bad config or input (a ``ConfigError``,
or Hydra's own composition errors), 1 a run that started and failed, 130 interrupted (Ctrl-C or
SIGTERM; the run's summary says ``interrupted``).

Light on purpose (Hydra, OmegaConf and the config layer only): ``__main__`` holds the contract
around composing, so a typo, ``--help`` or ``--cfg job`` is answered before the run's modules
(torch, torchtitan) are imported, and a ``ConfigError`` raised while they are imported (a
torchtitan that lacks names the project uses, ``qwen3_trn.titan``) is bad input like any other.
"""

from __future__ import annotations

import os
import sys
import traceback
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator

import yaml
from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from qwen3_trn.config.composition import composition_error
from qwen3_trn.errors import ConfigError, RunInterrupted, describe_error
from qwen3_trn.records import TRACEBACK_ENV
from qwen3_trn.redact import redact_url, scrub

__all__ = ["EXIT_BAD_INPUT", "EXIT_DONE", "EXIT_FAILED", "EXIT_INTERRUPTED", "exit_status", "imports_of_entry_point"]

EXIT_DONE, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130


def _is_composition_error(exc: BaseException) -> bool:
    """Raised while Hydra composed the config (not by a run): Hydra's, OmegaConf's and YAML's
    errors, and anything raised from inside Hydra itself."""
    if isinstance(exc, (ConfigError, HydraException, OmegaConfBaseException, yaml.YAMLError)):
        return True
    frames = traceback.extract_tb(exc.__traceback__)
    return bool(frames) and "/hydra/" in frames[-1].filename


def _report(message: str, status: int) -> None:
    hint = f"\n(set {TRACEBACK_ENV}=1 for a traceback)" if status == EXIT_BAD_INPUT else ""
    print(f"error: {scrub(redact_url(message))}{hint}", file=sys.stderr, flush=True)  # an override may hold a secret
    sys.exit(status)


@contextmanager
def exit_status(search_dirs: Iterable[Path] = ()) -> Iterator[None]:
    """The command's exit-code contract around composing and running: a ConfigError or
    composition error is one clear paragraph and exit 2, an interrupted run exits 130, a
    failed run 1 (its traceback in the run's error.log). ``search_dirs``: the config
    directories, to point composition errors at their file."""
    try:
        yield
    except SystemExit:
        raise
    except KeyboardInterrupt as exc:
        how = f"signal {exc.signum}" if isinstance(exc, RunInterrupted) else "Ctrl-C"
        print(f"qwen3_trn: interrupted ({how}); the run is marked interrupted in its summary.json", file=sys.stderr, flush=True)
        sys.exit(EXIT_INTERRUPTED)
    except Exception as exc:
        if os.environ.get(TRACEBACK_ENV):
            raise
        if _is_composition_error(exc):
            _report(str(composition_error(exc, search_dirs)), EXIT_BAD_INPUT)
        log = getattr(exc, "error_log", None)
        _report(describe_error(exc) + (f"\n  traceback: {log}" if log else ""), EXIT_FAILED)


@contextmanager
def imports_of_entry_point(module_name: str) -> Iterator[None]:
    """Around the module-level imports of a ``python -m qwen3_trn.<tool>`` entry point: a
    ConfigError raised while they import (a torchtitan that lacks what the project uses,
    ``qwen3_trn.titan``) is bad input, exit 2, when the module runs as the command
    (``module_name`` is ``"__main__"``); imported as a library, the error propagates."""
    try:
        yield
    except ConfigError as exc:
        if module_name != "__main__" or os.environ.get(TRACEBACK_ENV):
            raise
        _report(str(exc), EXIT_BAD_INPUT)
