"""The process that will write a run's end into its records, and whether it is verifiably gone
(docs/reliability.md). Its start time (``/proc/<pid>/stat`` field 22) and the boot id tell a
reused pid from the original process."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

# The record's section that names its process.
PROCESS_SECTION = "process"


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def _start_ticks(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name (2nd field) is in parentheses and may hold spaces: count after it
    return int(stat.rsplit(")", 1)[1].split()[19])


def this_process() -> dict[str, Any]:
    """This process as a record names it."""
    pid = os.getpid()
    return {"host": socket.gethostname(), "pid": pid, "started": _start_ticks(pid), "boot_id": _boot_id()}


def on_this_host(process: dict[str, Any]) -> bool:
    return process.get("host") == socket.gethostname()


def is_gone(process: dict[str, Any]) -> bool:
    """Whether the recorded process verifiably no longer exists (its pid free, a zombie, or
    another process's); False where that cannot be known (another host, nothing recorded)."""
    pid = process.get("pid")
    if not isinstance(pid, int) or not on_this_host(process):
        return False
    if process.get("boot_id") and _boot_id() and process["boot_id"] != _boot_id():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # another user's process holds the pid now (or still does)
        pass
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False  # no /proc: the pid exists, so the process is taken to
    if state in ("Z", "X"):
        return True
    started = process.get("started")
    return started is not None and _start_ticks(pid) != started


def where(process: dict[str, Any]) -> str:
    """Where the process runs, as ``qwen3_trn.status`` shows a run still recorded running."""
    if not process.get("host"):
        return ""
    if on_this_host(process):
        return f"pid {process.get('pid')}"
    return f"on host {process['host']} (cannot check from here)"
