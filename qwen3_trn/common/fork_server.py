"""Child processes forked from a server that imported their heavy modules once (multiprocessing's
``forkserver`` start method), instead of each importing torch and torchtitan again (about 4 s of
CPU a process): CPU ranks (``launch.node``, started by torch elastic), a search's concurrent trials
(``sweeps.job_processes``) and the comparison's mode runs (``compare``).
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
import os
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence


@contextmanager
def fork_server(preload: Sequence[str]) -> Iterator[None]:
    """A fork server that imported ``preload``, started for this block and stopped after it: its
    children get the block's environment and working directory, not those of an earlier server
    of this process. Python keeps one fork server per process; ``ForkServer._stop`` (CPython
    3.8+) ends it."""
    server = multiprocessing.forkserver._forkserver
    server._stop()
    multiprocessing.set_forkserver_preload(list(preload))
    try:
        yield
    finally:
        server._stop()


def release_fork_server() -> None:
    """In a child of a fork server, close its copy of the write end of the server's liveness
    pipe, which multiprocessing hands every child so that it may use the server too (CPython's
    ``forkserver._serve_one``). Held by a child, it keeps the server alive after its parent
    dies (and with it a rank, whose death signal is the server's end), and makes the parent's
    ``_stop`` wait for the child. The child's own children then start from a server of their own."""
    server = multiprocessing.forkserver._forkserver
    if server._forkserver_alive_fd is not None and server._forkserver_pid is None:  # a fork server's child
        os.close(server._forkserver_alive_fd)
        server._forkserver_alive_fd = None


def start_child(target: Callable[..., None], *args: Any, name: str) -> multiprocessing.process.BaseProcess:
    """``target(*args)`` in a child of this process's fork server (``fork_server``), which
    releases the server first (``release_fork_server``)."""
    process = multiprocessing.get_context("forkserver").Process(target=_released, args=(target, *args), name=name)
    process.start()
    return process


def _released(target: Callable[..., None], *args: Any) -> None:
    release_fork_server()
    target(*args)


__all__ = ["fork_server", "release_fork_server", "start_child"]
