"""Wall time of a sweep of small jobs with and without device packing.

    python benchmarks/packing.py [--jobs 4] [key=value ...]

Without packing, Hydra's basic launcher runs the jobs one after another, each free to use
every core. With packing, Hydra's joblib launcher runs as many jobs as there are devices at
once, each confined to ``launcher.devices_per_job`` of them.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT = ["logger=none", "training.steps=10", "training.seq_len=128"]


def sweep(args: list[str], sweep_dir: Path, env: dict[str, str]) -> float:
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "qwen3_trn", "-m", *args, f"hydra.sweep.dir={sweep_dir}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, **env},
    )
    if done.returncode:
        sys.exit(done.stderr[-3000:])
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=4)
    parser.add_argument("--devices-per-job", type=int, default=1)
    parser.add_argument("overrides", nargs="*", default=DEFAULT)
    args = parser.parse_args()
    seeds = "training.seed=" + ",".join(str(i) for i in range(1, args.jobs + 1))
    cores = len(os.sched_getaffinity(0))
    parallel = max(1, cores // args.devices_per_job)
    with tempfile.TemporaryDirectory() as tmp:
        env = {"QWEN3_TRN_SLOTS_DIR": f"{tmp}/slots"}
        serial = sweep([*args.overrides, seeds], Path(tmp) / "serial", env)
        packed = sweep(
            [
                *args.overrides,
                seeds,
                "hydra/launcher=joblib",
                f"hydra.launcher.n_jobs={parallel}",
                f"launcher.devices_per_job={args.devices_per_job}",
            ],
            Path(tmp) / "packed",
            env,
        )
    print(
        f"{args.jobs} jobs on {cores} cores: sequential {serial:.1f} s, packed ({parallel} at once, "
        f"{args.devices_per_job} core each) {packed:.1f} s, speed-up {serial / packed:.2f}x"
    )


if __name__ == "__main__":
    main()
