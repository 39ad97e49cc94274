"""The host allocator keeps freed memory for reuse: a large buffer allocated again is not faulted in
again. tcmalloc is preloaded by restarting the command (where installed); glibc is tuned otherwise."""

from __future__ import annotations

import subprocess
import sys

import pytest

from qwen3_trn.allocator import HOST_ALLOCATOR_ENV, tcmalloc_library
from tests.conftest import REPO, cli_env, run_in_process

# Optionally restarts under tcmalloc (as `python -m qwen3_trn` does first), optionally tunes glibc,
# then allocates and frees a 256 MiB tensor six times, as steps of a training loop do, and prints
# whether tcmalloc is loaded, how many times the script started, and the page faults of the last
# allocation (the steady state: the first one or two may still grow the heap).
_FAULTS_OF_STEADY_ALLOCATION = """
import os, resource, sys
from qwen3_trn.allocator import exec_with_tcmalloc, retain_freed_memory, uses_tcmalloc
os.environ["STARTS"] = os.environ.get("STARTS", "") + "x"
if sys.argv[1] == "restart":
    exec_with_tcmalloc()
import torch
if sys.argv[1] == "retain":
    assert retain_freed_memory() is True
for _ in range(6):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    buffer = torch.ones(64 * 2**20)
    del buffer
print(uses_tcmalloc(), len(os.environ["STARTS"]), resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _steady(mode: str, env: dict | None = None) -> tuple[bool, int, int]:
    done = subprocess.run(
        [sys.executable, "-c", _FAULTS_OF_STEADY_ALLOCATION, mode],
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


def test_tuned_glibc_reuses_large_buffers_instead_of_faulting_them_in_again():
    default, retained = _steady("default")[2], _steady("retain")[2]
    assert default > 50_000, "glibc maps a 256 MiB block afresh each time (65,536 pages)"
    assert retained < default / 20


@pytest.mark.skipif(tcmalloc_library() is None, reason="tcmalloc is not installed (Debian: libtcmalloc-minimal4)")
def test_the_command_restarts_once_under_tcmalloc_which_reuses_large_buffers():
    default = _steady("default")[2]
    tcmalloc, starts, faults = _steady("restart")
    assert tcmalloc and starts == 2, "one restart, with tcmalloc loaded"
    assert faults < default / 20
    # Chosen off: no restart, the system's malloc.
    assert _steady("restart", {HOST_ALLOCATOR_ENV: "system"})[:2] == (False, 1)
    assert _steady("restart", {HOST_ALLOCATOR_ENV: "glibc"})[:2] == (False, 1)


def test_an_unknown_host_allocator_is_refused_before_anything_starts(tmp_path, monkeypatch):
    monkeypatch.setenv(HOST_ALLOCATOR_ENV, "jemalloc")
    code, stderr = run_in_process([], tmp_path / "run")
    assert code == 2 and "Traceback" not in stderr
    assert f"{HOST_ALLOCATOR_ENV}: 'jemalloc' is not one of auto, glibc, system" in stderr
    assert not (tmp_path / "run").exists()
