"""The first training steps against the steady ones, per backend.

    python benchmarks/warmup_steps.py [--repeats 3] [--backends hf_v5 native] [--regions] [key=value ...]

Default overrides: ``training.steps=12 validation.enable=false logger=none``.

Whole command (the default): ``python -m qwen3_trn`` per backend, alternating in one session,
each step's wall time read from the run's metrics.jsonl (``step_time_s``, torchtitan's
``time_metrics/end_to_end(s)``: the time from the previous step's log to this one's, so step 1
also holds the trainer's build after its metrics processor: parallelize, weight init, optimizer).
Prints, per backend, the median of each step over the repeats with every run's figure, the load
average beside each run, the ratio of steps 2-8 to the steps after them, and whether every
repeat logged the same losses.

``--regions``: the trainer built in a process of its own as the command builds it
(``benchmarks/inprocess.py``), each train step timed in parts (forward + backward, gradient
clipping, optimizer step), with the page faults of each part; medians over the repeats.

The machine may be shared: a step's wall time moves with the load of other work (and with two
compute threads on two busy cores, by far more than the work); the load averages say how busy
it was. The figures in docs/performance.md were taken with the benchmark's processes given the
cores first (``nice -n -20`` in an autogroup of their own).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OVERRIDES = ["training.steps=12", "validation.enable=false", "logger=none"]
WARM_STEPS = range(2, 9)
REGIONS = ("forward+backward", "grad clip", "optimizer step", "rest")
ENV = {"PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def run_command(backend: str, overrides: list[str], out: Path) -> dict:
    load_before = os.getloadavg()[0]
    done = subprocess.run(
        [sys.executable, "-m", "qwen3_trn", f"backend={backend}", *overrides, f"hydra.run.dir={out}"],
        check=False,
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, **ENV},
    )
    if done.returncode:
        sys.exit(f"failed: backend={backend} {' '.join(overrides)}\n{done.stderr[-3000:]}")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {
        "load": (load_before + os.getloadavg()[0]) / 2,
        "step_s": {r["step"]: r["step_time_s"] for r in records},
        "losses": [r["loss"] for r in records],
    }


def print_commands(results: dict[str, list[dict]], overrides: list[str]) -> None:
    for backend, runs in results.items():
        steps = sorted(runs[0]["step_s"])
        loads = " ".join(f"{r['load']:.1f}" for r in runs)
        print(f"\n{backend}: {' '.join(overrides)}; load average per run {loads}")
        print(f"{'step':>4} {'median ms':>10}   per run ms")
        median = {}
        for step in steps:
            per_run = [r["step_s"][step] * 1e3 for r in runs]
            median[step] = statistics.median(per_run)
            print(f"{step:>4} {median[step]:>10.1f}   {' '.join(f'{ms:7.1f}' for ms in per_run)}")
        warm = [median[s] for s in WARM_STEPS if s in median]
        steady = [median[s] for s in steps if s > WARM_STEPS[-1]]
        if warm and steady:
            ratio = statistics.median(warm) / statistics.median(steady)
            print(
                f"steps {WARM_STEPS[0]}-{WARM_STEPS[-1]} {statistics.median(warm):.1f} ms, "
                f"steps {WARM_STEPS[-1] + 1}-{steps[-1]} {statistics.median(steady):.1f} ms: {ratio:.2f}x"
            )
        same = all(r["losses"] == runs[0]["losses"] for r in runs)
        print(
            f"losses {'identical in every run' if same else 'DIFFER between runs'}: {runs[0]['losses'][0]:.6f} -> {runs[0]['losses'][-1]:.6f}"
        )


# --------------------------------------------------------------------------------------------
# --regions: one process per run, the train step timed in parts
# --------------------------------------------------------------------------------------------


def _timed(parts: dict[str, list[float]], label: str, fn):
    @functools.wraps(fn)
    def timed(*args, **kwargs):
        start, faults = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        try:
            return fn(*args, **kwargs)
        finally:
            part = parts.setdefault(label, [0.0, 0])
            part[0] += time.perf_counter() - start
            part[1] += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults

    return timed


def regions_one(overrides: list[str]) -> list[dict[str, list[float]]]:
    """Per step: {region: [seconds, page faults]} of the trainer's own train_step."""
    from inprocess import single_rank_trainer_config
    from torchtitan import trainer as trainer_module

    steps = next((int(o.split("=", 1)[1]) for o in overrides if o.startswith("training.steps=")), 12)
    parts: dict[str, list[float]] = {}
    rows = []
    with tempfile.TemporaryDirectory() as out_dir:
        _cfg, config = single_rank_trainer_config(overrides, out_dir)
        trainer = config.build()
        try:
            trainer.forward_backward_step = _timed(parts, "forward+backward", trainer.forward_backward_step)
            trainer.optimizers.step = _timed(parts, "optimizer step", trainer.optimizers.step)
            trainer_module.dist_utils.clip_grad_norm_ = _timed(parts, "grad clip", trainer_module.dist_utils.clip_grad_norm_)
            data = trainer.batch_generator(trainer.dataloader)
            for _ in range(steps):
                parts.clear()
                trainer.step += 1
                whole = _timed(parts, "total", trainer.train_step)
                whole(data)
                rest = parts["total"][0] - sum(parts[r][0] for r in REGIONS[:-1])
                rest_faults = parts["total"][1] - sum(parts[r][1] for r in REGIONS[:-1])
                rows.append({**{r: list(parts[r]) for r in REGIONS[:-1]}, "rest": [rest, rest_faults], "total": list(parts["total"])})
        finally:
            trainer.close()
    return rows


def _free_port() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return str(sock.getsockname()[1])


def run_regions(backend: str, overrides: list[str]) -> dict:
    load_before = os.getloadavg()[0]
    cmd = [sys.executable, __file__, "--one", f"backend={backend}", *overrides]
    env = {**os.environ, **ENV, "MASTER_PORT": _free_port(), "KINETO_LOG_LEVEL": "5"}
    done = subprocess.run(cmd, check=False, cwd=REPO, capture_output=True, text=True, env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        sys.exit(f"failed: {' '.join(cmd)}\n{done.stderr[-3000:]}")
    return {"load": (load_before + os.getloadavg()[0]) / 2, "rows": json.loads(lines[-1][len("RESULT ") :])}


def print_regions(results: dict[str, list[dict]], overrides: list[str]) -> None:
    for backend, runs in results.items():
        loads = " ".join(f"{r['load']:.1f}" for r in runs)
        print(f"\n{backend} (train_step in parts): {' '.join(overrides)}; load average per run {loads}")
        steps = len(runs[0]["rows"])
        print(f"{'step':>4} " + " ".join(f"{name:>22s}" for name in (*REGIONS, "total")))
        for index in range(steps):
            cells = []
            for name in (*REGIONS, "total"):
                ms = statistics.median(r["rows"][index][name][0] * 1e3 for r in runs)
                faults = statistics.median(r["rows"][index][name][1] for r in runs)
                cells.append(f"{ms:9.1f} ms {faults:6.0f} flt" if name != "total" else f"{ms:9.1f} ms {'':10s}")
            print(f"{index + 1:>4} " + " ".join(f"{cell:>22s}" for cell in cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--backends", nargs="+", default=["hf_v5", "native"])
    parser.add_argument("--regions", action="store_true", help="time the parts of each train step in-process instead")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # child process of --regions: one backend, prints JSON
    parser.add_argument("overrides", nargs="*", default=DEFAULT_OVERRIDES)
    args = parser.parse_args()
    if args.one:
        print("RESULT " + json.dumps(regions_one([args.one, *args.overrides])))
        return
    results: dict[str, list[dict]] = {backend: [] for backend in args.backends}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            order = args.backends if repeat % 2 == 0 else list(reversed(args.backends))
            for backend in order:
                if args.regions:
                    results[backend].append(run_regions(backend, args.overrides))
                else:
                    results[backend].append(run_command(backend, args.overrides, Path(tmp) / f"{backend}-{repeat}"))
    (print_regions if args.regions else print_commands)(results, args.overrides)


if __name__ == "__main__":
    main()
