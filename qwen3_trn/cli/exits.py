"""The exit status of ``python -m qwen3_trn``: 0 done, 2 bad input, 1 a started run failed,
130 interrupted.

Light (no torch): a ``ConfigError`` raised while the run's modules import (``qwen3_trn.titan``)
is bad input like any other.
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

from qwen3_trn.common.errors import ConfigError, RunInterrupted, describe_error
from qwen3_trn.common.redact import redact_url, scrub
from qwen3_trn.config.composition import composition_error
from qwen3_trn.results.records import TRACEBACK_ENV

__all__ = ["EXIT_BAD_INPUT", "EXIT_DONE", "EXIT_FAILED", "EXIT_INTERRUPTED", "exit_status", "imports_of_entry_point"]

EXIT_DONE, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130


def _is_composition_error(exc: BaseException) -> bool:
    """Hydra's, OmegaConf's or YAML's error, or anything raised from inside Hydra."""
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
    """Bad input or a composition error: one paragraph, exit 2; interrupted: 130; a failed run: 1
    (traceback in its error.log). ``search_dirs`` point composition errors at their file."""
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
    """Make a ``ConfigError`` raised by an entry point's imports exit 2 when ``module_name`` is
    ``"__main__"``; imported as a library, it propagates."""
    try:
        yield
    except ConfigError as exc:
        if module_name != "__main__" or os.environ.get(TRACEBACK_ENV):
            raise
        _report(str(exc), EXIT_BAD_INPUT)
