"""The host allocator keeps freed memory for reuse: under tcmalloc (preloaded by restarting the
command, where installed) a large buffer allocated again is not faulted in again; otherwise glibc
is tuned to serve large buffers from its heap."""

from __future__ import annotations

import subprocess
import sys

import pytest

from qwen3_trn.common.allocator import HOST_ALLOCATOR_ENV, tcmalloc_library
from tests.commands import cli_env, command_in_process
from tests.conftest import REPO

# Optionally restarts under tcmalloc (as `python -m qwen3_trn` does first), then (with "allocate")
# allocates and frees a 256 MiB tensor six times, as steps of a training loop do, and prints
# whether tcmalloc is loaded, how many times the script started, and the page faults of the last
# allocation (the steady state: the first one or two may still grow the heap; 0 without "allocate").
_FAULTS_OF_STEADY_ALLOCATION = """
import os, resource, sys
from qwen3_trn.common.allocator import exec_with_tcmalloc, uses_tcmalloc
os.environ["STARTS"] = os.environ.get("STARTS", "") + "x"
if sys.argv[1] == "restart":
    exec_with_tcmalloc()
faults = 0
if sys.argv[2] == "allocate":
    import torch
    for _ in range(6):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        buffer = torch.ones(64 * 2**20)
        del buffer
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(uses_tcmalloc(), len(os.environ["STARTS"]), faults)
"""


def _steady(mode: str, env: dict | None = None, allocate: bool = True) -> tuple[bool, int, int]:
    done = subprocess.run(
        [sys.executable, "-c", _FAULTS_OF_STEADY_ALLOCATION, mode, "allocate" if allocate else "start-only"],
        check=False,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env=cli_env(env),
    )
    assert done.returncode == 0, done.stderr
    tcmalloc, starts, faults = done.stdout.split()
    return tcmalloc == "True", int(starts), int(faults)


# How much glibc's own count (mallinfo2) of the bytes it holds in blocks mapped one by one (hblkhd)
# grows for a 256 MiB tensor.
_MAPPED_BLOCK_BYTES = """
import ctypes, sys, torch
from qwen3_trn.common.allocator import retain_freed_memory
if sys.argv[1] == "retain":
    assert retain_freed_memory() is True
class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
mallinfo2 = ctypes.CDLL(None).mallinfo2
mallinfo2.restype = MallInfo2
before = mallinfo2().hblkhd
buffer = torch.ones(64 * 2**20)
print(mallinfo2().hblkhd - before)
"""


def _mapped_block_bytes(mode: str) -> int:
    done = subprocess.run(
        [sys.executable, "-c", _MAPPED_BLOCK_BYTES, mode], check=False, cwd=REPO, capture_output=True, text=True, timeout=120, env=cli_env()
    )
    assert done.returncode == 0, done.stderr
    return int(done.stdout.split()[-1])


def test_tuned_glibc_serves_large_buffers_from_its_heap_instead_of_a_mapping_each():
    # Whether the heap then hands the same pages back depends on the address-space layout (where
    # the heap cannot grow in place glibc maps more), which is why tcmalloc is preferred.
    assert _mapped_block_bytes("default") >= 256 * 2**20, "glibc maps a 256 MiB block on its own"
    assert _mapped_block_bytes("retain") == 0


@pytest.mark.skipif(tcmalloc_library() is None, reason="tcmalloc is not installed (Debian: libtcmalloc-minimal4)")
def test_the_command_restarts_once_under_tcmalloc_which_reuses_large_buffers():
    default = _steady("default")[2]
    assert default > 50_000, "glibc maps a 256 MiB block afresh each time (65,536 pages)"
    tcmalloc, starts, faults = _steady("restart")
    assert tcmalloc and starts == 2, "one restart, with tcmalloc loaded"
    assert faults < default / 20
    # Chosen off: no restart, the system's malloc (nothing to allocate to see that).
    assert _steady("restart", {HOST_ALLOCATOR_ENV: "system"}, allocate=False)[:2] == (False, 1)
    assert _steady("restart", {HOST_ALLOCATOR_ENV: "glibc"}, allocate=False)[:2] == (False, 1)


def test_an_unknown_host_allocator_is_refused_before_anything_starts(tmp_path):
    done = command_in_process([], tmp_path / "run", env={HOST_ALLOCATOR_ENV: "jemalloc"})
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"{HOST_ALLOCATOR_ENV}: 'jemalloc' is not one of auto, glibc, system" in done.stderr
    assert not (tmp_path / "run").exists()
