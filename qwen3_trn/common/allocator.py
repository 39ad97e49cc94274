"""The host allocator: freed CPU memory kept for reuse instead of faulted in again every step
(docs/hardware.md, "The host allocator").

glibc ``malloc`` serves blocks above its mmap threshold (at most 32 MiB) with a fresh ``mmap``
and unmaps them on free, so every step faults in its large buffers (FSDP's reduce buffers,
mixed-precision copies, optimizer temporaries) page by page: for MoE models a large, unsteady
part of the step. tcmalloc hands recurring block sizes back without faults; it must be loaded
before the process starts, so the command restarts itself once with it preloaded. Without it,
glibc is tuned (no mmap, the heap never trimmed), though a block that finds no free one of its
size still faults. ``QWEN3_TRN_HOST_ALLOCATOR``: ``auto`` (tcmalloc where installed, else tuned
glibc), ``glibc``, or ``system`` (``malloc`` as the process found it).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import multiprocessing
import os
import sys
from pathlib import Path

from qwen3_trn.common.errors import ConfigError

logger = logging.getLogger(__name__)

__all__ = [
    "HOST_ALLOCATOR_ENV",
    "exec_with_tcmalloc",
    "host_allocator_choice",
    "retain_freed_memory",
    "tcmalloc_library",
    "uses_tcmalloc",
]

HOST_ALLOCATOR_ENV = "QWEN3_TRN_HOST_ALLOCATOR"
CHOICES = ("auto", "glibc", "system")
# Set in the restarted process: a preload the loader refused must not restart it again.
_RESTARTED_ENV = "QWEN3_TRN_HOST_ALLOCATOR_RESTARTED"
# tcmalloc reports every allocation above this many bytes on stderr (default 1 GiB).
_LARGE_ALLOC_REPORT_ENV = "TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD"
_NEVER_REPORT = str(2**62)

# <malloc.h> parameter numbers.
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
# Free memory at the top of the heap that glibc may keep before trimming: the most an int holds.
_KEEP_BYTES = 2**31 - 1


def host_allocator_choice() -> str:
    choice = os.environ.get(HOST_ALLOCATOR_ENV, "auto") or "auto"
    if choice not in CHOICES:
        raise ConfigError(HOST_ALLOCATOR_ENV, f"'{choice}' is not one of {', '.join(CHOICES)}; unset it for the default (auto)")
    return choice


@functools.cache
def tcmalloc_library() -> str | None:
    """The tcmalloc shared library the loader finds here (the minimal build first), or None."""
    return ctypes.util.find_library("tcmalloc_minimal") or ctypes.util.find_library("tcmalloc")


def uses_tcmalloc() -> bool:
    """Whether tcmalloc is loaded into this process."""
    try:
        return "libtcmalloc" in Path("/proc/self/maps").read_text()
    except OSError:
        return False


def exec_with_tcmalloc() -> None:
    """Restart this command with tcmalloc preloaded, where ``auto`` chooses it and it is installed
    but not loaded; otherwise return and change nothing."""
    try:
        choice = host_allocator_choice()
    except ConfigError:
        return  # reported as bad input once the command runs (app.execute), before anything starts
    if choice != "auto" or uses_tcmalloc() or os.environ.get(_RESTARTED_ENV):
        return
    if multiprocessing.parent_process() is not None:  # a child keeps its parent's allocator: its argv is not a command's
        return
    library = tcmalloc_library()
    if library is None or not hasattr(sys, "orig_argv"):
        return
    preload = " ".join(filter(None, [library, os.environ.get("LD_PRELOAD")]))
    env = {**os.environ, "LD_PRELOAD": preload, _RESTARTED_ENV: "1"}
    env.setdefault(_LARGE_ALLOC_REPORT_ENV, _NEVER_REPORT)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)


@functools.cache
def retain_freed_memory() -> bool:
    """Tune glibc malloc (once per process) unless tcmalloc is loaded or ``system`` is chosen;
    True when applied."""
    if uses_tcmalloc():
        logger.info("host allocator: tcmalloc")
        return False
    if host_allocator_choice() == "system":
        logger.info("host allocator: the system's malloc, untuned (%s=system)", HOST_ALLOCATOR_ENV)
        return False
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # noqa: B018 - only glibc has it
    except (OSError, AttributeError, TypeError):
        logger.info("malloc is not glibc's (%s): CPU memory reuse left to the system allocator", name)
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    applied = bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, _KEEP_BYTES))
    if not applied:
        logger.warning("mallopt refused the memory-reuse settings; large CPU buffers are re-faulted each step")
    else:
        logger.info("host allocator: glibc, freed memory kept for reuse")
    return applied
