"""Keep freed CPU memory in the process for reuse instead of returning it to the OS every step.

PyTorch's CPU allocator is plain ``malloc``. glibc serves every block above its mmap threshold
(at most 32 MiB) with a fresh ``mmap`` and unmaps it on free, so each training step faults in
again, page by page, every large buffer it allocates: FSDP's gradient reduce buffers, the
mixed-precision parameter copies, optimizer temporaries. For MoE models, whose parameters are
many times their per-token compute, those page faults dominated the step (measured with
``benchmarks/moe_profile.py``: ~300k faults and over half of a debugmodel_moe step).
Serving large blocks from the heap and never trimming it lets later steps reuse the same
pages, as the CUDA caching allocator does on GPUs. The process keeps its peak footprint.

Only glibc has these knobs (``mallopt``); elsewhere nothing changes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging

logger = logging.getLogger(__name__)

__all__ = ["retain_freed_memory"]

# <malloc.h> parameter numbers.
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
# Free memory at the top of the heap that glibc may keep before trimming: the most an int holds.
_KEEP_BYTES = 2**31 - 1


@functools.cache
def retain_freed_memory() -> bool:
    """Tune glibc malloc (once per process); True when applied, False where malloc is not glibc's."""
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
    return applied
