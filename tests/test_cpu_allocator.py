"""The CPU adapter keeps freed memory for reuse: a large buffer allocated again is not re-faulted."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO

# Allocates and frees a 256 MiB tensor six times, as steps of a training loop do, and counts the
# page faults of the last allocation (the steady state: the first one or two may still grow the
# heap, when small objects allocated in between split the freed block).
_FAULTS_OF_STEADY_ALLOCATION = """
import resource, sys, torch
from qwen3_trn.devices.cpu_allocator import retain_freed_memory
if sys.argv[1] == "retain":
    assert retain_freed_memory() is True
for _ in range(6):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    buffer = torch.ones(64 * 2**20)
    del buffer
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> int:
    done = subprocess.run(
        [sys.executable, "-c", _FAULTS_OF_STEADY_ALLOCATION, mode], check=False, cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return int(done.stdout.split()[-1])


def test_large_buffers_are_reused_instead_of_faulted_in_again():
    default, retained = _faults("default"), _faults("retain")
    assert default > 50_000, "glibc maps a 256 MiB block afresh each time (65,536 pages)"
    assert retained < default / 20
