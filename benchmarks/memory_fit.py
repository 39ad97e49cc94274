"""Accuracy of the fit model: estimated against measured peak memory per rank, real CPU trainings.

    python benchmarks/memory_fit.py [--steps 4] [--only NAME ...]

For each case the estimate comes from the same code ``mode=plan`` / ``mode=check`` run
(``qwen3_trn.run.fit``: the composed estimate with activations probed by torch's MemTracker, and
torch's FSDPMemTracker over rank 0 on torchtitan's fake backend), and the measurement from a real
training of the same config on this CPU (gloo for two ranks), every rank measuring itself:

- allocator peak: the most bytes torch's CPU allocator held at once, from the allocation events
  torch.profiler records with ``profile_memory=True`` (from before the Trainer is built to the
  end of training). This is what the model estimates (tensors), so the ratios use it.
- RSS, in a second run without the profiler (its event buffers are resident too): the process's
  resident high-water mark (VmHWM, what ``peak_memory_gib`` in a run's summary reports on CPU)
  over its resident size just before the Trainer was built, and the whole process's peak; the
  estimate's total (peak + margin, which budgets the process itself) is compared with the latter.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MIB = 1 << 20

CASES = {
    "tiny dense": ["model=tiny"],
    "tiny MoE": ["model=tiny_moe"],
    "debugmodel": ["model=debugmodel"],
    "debugmodel, 2-rank FSDP": ["model=debugmodel", "launcher.nproc_per_node=2", "parallelism=fsdp"],
    "debugmodel, full AC": ["model=debugmodel", "training.activation_checkpoint=full"],
    "debugmodel, selective AC": ["model=debugmodel", "training.activation_checkpoint=selective"],
    "debugmodel, batch 8": ["model=debugmodel", "training.local_batch_size=8"],
}


def _compose(overrides: list[str], out_dir: str):
    from hydra import compose, initialize_config_dir

    from qwen3_trn.app import to_run_config
    from qwen3_trn.config.store import register_schema

    register_schema()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return to_run_config(compose("config", overrides=[*overrides, "logger=none", f"output_dir={out_dir}"]))


def estimate(overrides: list[str]) -> dict:
    """The composed estimate (as mode=plan prints it) and the tracker's (as mode=check does)."""
    from qwen3_trn.rank import check_layout
    from qwen3_trn.run.preflight import prepare

    with tempfile.TemporaryDirectory() as out:
        cfg = _compose([*overrides, "mode=plan"], out)
        composed = prepare(cfg).fit.memory.to_record()
        check = check_layout(_compose(overrides, out))
    return {"composed": composed, "tracker": check.get("tracked"), "tracker_error": check.get("tracked_error")}


def fit_seconds(overrides: list[str]) -> dict:
    """Seconds ``prepare`` spends in the fit model for a config, cold (first call in a process)."""
    import time

    from qwen3_trn.run import fit, preflight

    spent = []
    original = fit.preflight

    def timed(*args, **kwargs):
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            spent.append(time.perf_counter() - started)

    preflight.fit.preflight = timed
    with tempfile.TemporaryDirectory() as out:
        started = time.perf_counter()
        prepared = preflight.prepare(_compose(overrides, out))
        total = time.perf_counter() - started
    return {"fit_s": spent[0], "prepare_s": total, "source": prepared.fit.memory.source}


def _status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def measure(out_dir: str, what: str, overrides: list[str]) -> None:
    """One rank of a real training, measuring itself (run once per rank by torch's launcher):
    ``allocator`` under torch.profiler, ``rss`` without it (its event buffers are resident too)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from qwen3_trn.run.convert import compute_dtype, to_trainer_config
    from qwen3_trn.run.preflight import prepare

    for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}.items():
        os.environ.setdefault(key, value)
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    rank = int(os.environ["RANK"])
    cfg = _compose(overrides, str(Path(out_dir) / "run"))
    prepared = prepare(cfg)
    prepared.device.activate(compute_dtype(cfg, prepared.device))
    trainer_config = to_trainer_config(cfg, prepared.device, prepared.layout, prepared.backend)
    trainer_config.metrics.console_progress = False
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    before = _status("VmRSS:")
    if what == "rss":
        trainer = trainer_config.build()
        trainer.train()
        result = {"rss_before_build": before, "rss_high_water": _status("VmHWM:")}
    else:
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            trainer = trainer_config.build()
            trainer.train()
        events = sorted(
            (e.start_ns(), e.nbytes())
            for e in prof.profiler.kineto_results.events()
            if e.name() == "[memory]" and e.device_type().name == "CPU"
        )
        live = peak = 0
        for _, nbytes in events:
            live += nbytes
            peak = max(peak, live)
        result = {"allocator_peak": peak}
    trainer.close()
    (Path(out_dir) / f"{what}{rank}.json").write_text(json.dumps({"rank": rank, **result}))
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run(args: list[str], out_dir: Path | None = None) -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    done = subprocess.run(args, check=False, cwd=REPO, capture_output=True, text=True, env=env)
    if done.returncode:
        sys.exit(f"failed: {' '.join(args)}\n{done.stderr[-4000:]}")
    return done.stdout


def _ranks(overrides: list[str]) -> int:
    for item in overrides:
        if item.startswith("launcher.nproc_per_node="):
            return int(item.split("=", 1)[1])
    return 1


def run_case(overrides: list[str]) -> tuple[dict, list[dict]]:
    script = str(Path(__file__).resolve())
    est = json.loads(_run([sys.executable, script, "--estimate", *overrides]).strip().splitlines()[-1])
    ranks = _ranks(overrides)
    measured = [{} for _ in range(ranks)]
    for what in ("allocator", "rss"):
        with tempfile.TemporaryDirectory() as out:
            if ranks == 1:
                _run([sys.executable, script, "--measure", out, what, *overrides])
            else:
                _run(
                    [
                        sys.executable,
                        "-m",
                        "torch.distributed.run",
                        f"--nproc_per_node={ranks}",
                        "--rdzv_backend=c10d",
                        f"--rdzv_endpoint=127.0.0.1:{_free_port()}",
                        script,
                        "--measure",
                        out,
                        what,
                        *overrides,
                    ]
                )
            for r in range(ranks):
                measured[r].update(json.loads((Path(out) / f"{what}{r}.json").read_text()))
    return est, measured


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--only", nargs="*", help="case names to run (default: all)")
    parser.add_argument(
        "--overhead",
        type=int,
        default=0,
        metavar="N",
        help="instead: seconds the fit check adds to the default run's preflight, N fresh processes",
    )
    parser.add_argument("--fit-seconds", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    parser.add_argument("--estimate", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    parser.add_argument("--measure", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.fit_seconds is not None:
        print(json.dumps(fit_seconds(args.fit_seconds)))
        return
    if args.overhead:
        runs = [
            json.loads(_run([sys.executable, str(Path(__file__).resolve()), "--fit-seconds"]).strip().splitlines()[-1])
            for _ in range(args.overhead)
        ]
        fit_s = sorted(r["fit_s"] for r in runs)
        print(
            f"default run (python -m qwen3_trn): the fit check takes {fit_s[len(fit_s) // 2] * 1000:.0f} ms (median of "
            f"{len(runs)} fresh processes; min {fit_s[0] * 1000:.0f}, max {fit_s[-1] * 1000:.0f}) of a "
            f"{sorted(r['prepare_s'] for r in runs)[len(runs) // 2]:.2f} s preflight; estimate source: {runs[0]['source']}"
        )
        return
    if args.estimate is not None:
        print(json.dumps(estimate(args.estimate)))
        return
    if args.measure is not None:
        measure(args.measure[0], args.measure[1], args.measure[2:])
        return
    header = (
        f"{'case':<26} {'rank':>4} {'composed':>9} {'tracker':>9} {'measured':>9} {'comp/meas':>9} {'trk/meas':>9}"
        f" {'RSS +':>8} {'total est':>9} {'RSS peak':>9} {'total/RSS':>9}"
    )
    print(
        "MiB per rank; measured = torch CPU allocator peak (profiler memory events); RSS + = VmHWM - RSS before the "
        "Trainer was built; total est = estimate incl. margin vs the whole process's RSS peak. Shared machine."
    )
    print(header)
    for name, overrides in CASES.items():
        if args.only and name not in args.only:
            continue
        overrides = [*overrides, f"training.steps={args.steps}", "optimizer.warmup_steps=1"]
        est, measured = run_case(overrides)
        composed = est["composed"]["bytes"]
        tracker = (est["tracker"] or {}).get("bytes")
        total = sum(composed[k] for k in ("peak", "margin"))
        for m in measured:
            peak = m["allocator_peak"]
            trk = f"{tracker['peak'] / MIB:>9.1f}" if tracker else f"{'-':>9}"
            trk_ratio = f"{tracker['peak'] / peak:>9.2f}" if tracker else f"{'-':>9}"
            print(
                f"{name:<26} {m['rank']:>4} {composed['peak'] / MIB:>9.1f} {trk} {peak / MIB:>9.1f} "
                f"{composed['peak'] / peak:>9.2f} {trk_ratio} {(m['rss_high_water'] - m['rss_before_build']) / MIB:>8.1f} "
                f"{total / MIB:>9.1f} {m['rss_high_water'] / MIB:>9.1f} {total / m['rss_high_water']:>9.2f}",
                flush=True,
            )
        if est.get("tracker_error"):
            print(f"  tracker: {est['tracker_error']}")


if __name__ == "__main__":
    main()
