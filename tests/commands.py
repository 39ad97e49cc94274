"""``python -m qwen3_trn ARGS`` as the tests run it: in this process through its real entry point
(``command_in_process``; another entry point's ``main``: ``entry_point_in_process``), or as a real process (``command_in_subprocess``; ``start_command``
starts one to signal or kill). Both offline, with the checkout's package, and return the exit
status with what went to stdout and stderr."""

from __future__ import annotations

import contextlib
import importlib
import io
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

from hydra.core.hydra_config import HydraConfig

from qwen3_trn.common.allocator import HOST_ALLOCATOR_ENV
from qwen3_trn.results.records import TRACEBACK_ENV

REPO = Path(__file__).resolve().parents[1]

# Nothing from the Hugging Face hub: the runs use the shipped tokenizer, the exports are local.
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def cli_env(env: dict | None = None) -> dict[str, str]:
    """The environment of a process the tests start: offline, the checkout's package first on
    the path, ``env`` added."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, **OFFLINE, "PYTHONPATH": path, **(env or {})}


def _command_line(args: list[str], run_dir: Path | None, config_dir: Path | None) -> list[str]:
    """The command's arguments with the run directory pinned and a config directory added."""
    return [*(["--config-dir", str(config_dir)] if config_dir else []), *args, *([f"hydra.run.dir={run_dir}"] if run_dir else [])]


@contextlib.contextmanager
def _process_state_kept() -> Iterator[None]:
    """A command runs outside any Hydra run, and what it changes in its process is put back
    afterwards: the environment (the launch time, the launcher's variables), ``sys.argv``
    (redacted), the root logger (a run points it at its own rank log) and Hydra's record of the
    run it is in (``HydraConfig``)."""
    env, argv, hydra_run = dict(os.environ), list(sys.argv), HydraConfig.instance().cfg
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    HydraConfig.instance().cfg = None
    try:
        yield
    finally:
        for handler in root.handlers:
            if handler not in handlers:
                handler.close()
        root.handlers[:] = handlers
        root.setLevel(level)
        logging.captureWarnings(False)
        HydraConfig.instance().cfg = hydra_run
        sys.argv[:] = argv
        os.environ.clear()
        os.environ.update(env)


def entry_point_in_process(main: Callable[[], int | None], argv: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    """An entry point's ``main`` in this process, as ``python -m`` runs it with ``argv`` (``main``
    reads ``sys.argv``, as each entry point's argument parser does by default): offline,
    ``env`` added, the system allocator chosen (importing an entry point otherwise restarts the
    process under tcmalloc), its exit status and what went to stdout and stderr returned, and the
    process's state put back after (``_process_state_kept``). A ``main`` that returns its status
    (``qwen3_trn.status``) exits with it."""
    out, err = io.StringIO(), io.StringIO()
    with _process_state_kept(), contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        os.environ.update({HOST_ALLOCATOR_ENV: "system", **OFFLINE, **(env or {})})
        for name in ("HYDRA_FULL_ERROR", TRACEBACK_ENV):
            os.environ.pop(name, None)
        sys.argv[:] = argv
        try:
            code = main() or 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    return subprocess.CompletedProcess(argv[1:], code, out.getvalue(), err.getvalue())


def command_in_process(
    args: list[str], run_dir: Path | None = None, env: dict | None = None, config_dir: Path | None = None
) -> subprocess.CompletedProcess:
    """``python -m qwen3_trn ARGS`` through its real entry point (``qwen3_trn.__main__.main``:
    Hydra's argument handling, ``-m`` sweeps with their jobs one after another) in this process:
    one-rank runs train here, more ranks start as the elastic launcher's processes. ``run_dir``
    pins the run directory, ``config_dir`` is the ``--config-dir``."""
    argv = ["qwen3_trn", *_command_line(args, run_dir, config_dir)]
    return entry_point_in_process(lambda: importlib.import_module("qwen3_trn.__main__").main(), argv, env)


def start_command(
    args: list[str], run_dir: Path | None = None, env: dict | None = None, cwd: Path | None = None, **popen: Any
) -> subprocess.Popen:
    """``python -m qwen3_trn ARGS`` started as a process in its own session, as a terminal runs
    it (Ctrl-C reaches the whole session's foreground group), in ``cwd`` (default the checkout),
    its output piped; ``popen`` changes how it is started."""
    options = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True, "start_new_session": True, **popen}
    command = [sys.executable, "-m", "qwen3_trn", *_command_line(args, run_dir, None)]
    return subprocess.Popen(command, cwd=cwd or REPO, env=cli_env(env), **options)


def command_in_subprocess(
    args: list[str], run_dir: Path | None = None, env: dict | None = None, cwd: Path | None = None, timeout: float = 600
) -> subprocess.CompletedProcess:
    """``python -m qwen3_trn ARGS`` as a real process (``start_command``), waited for."""
    process = start_command(args, run_dir, env, cwd)
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def _parent_of(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except OSError:
        return None


def rank_processes(pids: list[int]) -> list[int]:
    """Of ``pids``, the ranks torch elastic's agent started: on CPU, the children of the fork
    server the launcher started for them (qwen3_trn.launch.node), which has their command line."""
    servers = {pid for pid in pids if _is_fork_server(pid) and not _is_fork_server(_parent_of(pid))}
    return [pid for pid in pids if _parent_of(pid) in servers]


def _is_fork_server(pid: int | None) -> bool:
    """A process with a fork server's command line: the server, or a process it forked."""
    try:
        return b"multiprocessing.forkserver" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
