"""Log silencing for the launching process while it probes libraries before a run; they speak
again in the ranks' logs.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["logging_disabled"]


@contextmanager
def logging_disabled(level: int) -> Iterator[None]:
    """Drop log records at ``level`` or below inside the block, then restore the threshold."""
    previous = logging.root.manager.disable
    logging.disable(level)
    try:
        yield
    finally:
        logging.disable(previous)
