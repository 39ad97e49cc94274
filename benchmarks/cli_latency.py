"""How long ``python -m qwen3_trn`` takes to answer what needs no training: a mistyped key,
``--help``, ``--cfg job``, two values out of range, ``data=files`` without ``data.path``,
``mode=plan``; beside ``python -c "import hydra"``, the floor of any
Hydra command.

    python benchmarks/cli_latency.py [--pairs 5] [--checkout DIR ...]

Each round runs every command once in every checkout (this one by default; give several to
compare versions side by side, e.g. one unpacked with ``git archive``), alternating, so that
load on the machine falls on all alike. Prints per command and checkout the median wall time,
the median CPU time (user + system) and the largest resident memory of the whole process, and
the exit statuses seen.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# (label, arguments after the interpreter); {run_dir} is a fresh directory for each run.
COMMANDS = [
    ("hydra floor", ["-c", "import hydra"]),
    ("typo", ["-m", "qwen3_trn", "training.stpes=1"]),
    ("--help", ["-m", "qwen3_trn", "--help"]),
    ("--cfg job", ["-m", "qwen3_trn", "--cfg", "job"]),
    ("out of range", ["-m", "qwen3_trn", "training.steps=0", "optimizer.lr=-1", "hydra.run.dir={run_dir}"]),
    ("no data.path", ["-m", "qwen3_trn", "data=files", "hydra.run.dir={run_dir}"]),
    ("mode=plan", ["-m", "qwen3_trn", "mode=plan", "debug=smoke", "hydra.run.dir={run_dir}"]),
]


def _run(args: list[str], checkout: Path) -> tuple[float, float, float, int]:
    """Wall s, CPU s, peak RSS MiB and exit status of one whole process."""
    env = {**os.environ, "PYTHONPATH": str(checkout), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    with tempfile.TemporaryDirectory() as tmp:
        argv = [sys.executable, *(arg.format(run_dir=Path(tmp) / "run") for arg in args)]
        started = time.perf_counter()
        process = subprocess.Popen(argv, cwd=checkout, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _, status, usage = os.wait4(process.pid, 0)
        wall = time.perf_counter() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, process.returncode  # ru_maxrss: KiB (Linux)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=5, help="rounds of every command in every checkout")
    parser.add_argument("--checkout", type=Path, action="append", help="a checkout to run from (repeatable; default: this one)")
    parser.add_argument("--only", action="append", help="run only the commands with these labels")
    args = parser.parse_args()
    checkouts = [path.resolve() for path in args.checkout or [REPO]]
    commands = [(label, cmd) for label, cmd in COMMANDS if not args.only or label in args.only]
    results: dict[tuple[str, Path], list[tuple[float, float, float, int]]] = {}
    for round_ in range(args.pairs):
        order = checkouts if round_ % 2 == 0 else checkouts[::-1]
        for label, cmd in commands:
            for checkout in order:
                results.setdefault((label, checkout), []).append(_run(cmd, checkout))
    print(f"{args.pairs} runs each, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end")
    print("| command | checkout | wall s (median) | CPU s (median) | peak RSS MiB | exit |")
    print("|---|---|---|---|---|---|")
    for (label, checkout), runs in results.items():
        cmd = dict(commands)[label]
        shown = shlex.join(["python", *(arg for arg in cmd if "{run_dir}" not in arg)])
        walls, cpus, rss, codes = zip(*runs)
        print(
            f"| `{shown}` | {checkout.name} | {statistics.median(walls):.2f} | {statistics.median(cpus):.2f} | "
            f"{max(rss):.0f} | {','.join(sorted({str(c) for c in codes}))} |"
        )


if __name__ == "__main__":
    main()
