"""Log silencing for the launching process, which probes libraries (torchtitan, datasets,
tokenizers) before a run starts: the console then gets only the project's own summary, and the
libraries speak again in the ranks' logs."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["logging_disabled"]


@contextmanager
def logging_disabled(level: int) -> Iterator[None]:
    """Drop every log record at ``level`` or below inside the block (``logging.disable``), then
    restore the threshold that was in force before."""
    previous = logging.root.manager.disable
    logging.disable(level)
    try:
        yield
    finally:
        logging.disable(previous)
