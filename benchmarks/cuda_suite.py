"""Training throughput on one CUDA GPU: the project's modes at real sizes, through the real CLI.

    python benchmarks/cuda_suite.py                 # run every case (a machine with a GPU)
    python benchmarks/cuda_suite.py --dry-run       # print the commands, run nothing
    python benchmarks/cuda_suite.py --plan          # validate every case with mode=plan (any machine)
    python benchmarks/cuda_suite.py --cases native-0.6B moe-30B-A3B-4L training.steps=50

Cases (bf16 mixed precision, FSDP on 1 GPU, torch.compile with inductor, flex attention):
native Qwen3-0.6B and 1.7B, hf_v5 (Transformers v5 modeling) at the same sizes, and
``backend=nki_moe backend.kernels=grouped_mm`` on Qwen3-30B-A3B cut to 4 layers (128 experts, top-8).
Each case is one ``python -m qwen3_trn`` run; the table prints tokens/s (steps after the first,
which compiles), MFU as torchtitan computes it against the GPU's bf16 peak from its table of
known GPUs, and peak memory (torchtitan's reserved-bytes peak).

Data is the embedded corpus (no network needed); pass ``data=c4`` to stream C4 instead.
Not measured by this project: it has no GPU. The 30B-A3B case holds ~3B parameters with
AdamW state in fp32 (~50 GiB): it needs an 80 GiB GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]

# What every case shares: one GPU, FSDP (torchtitan applies it at one rank too), bf16 params,
# compile, flex attention, long sequences, and enough steps for a steady state after compile.
COMMON = (
    "device=cuda",
    "parallelism=fsdp",
    "launcher.nproc_per_node=1",
    "training.dtype=float32",
    "training.mixed_precision_param=bfloat16",
    "compile=inductor",
    "model.attention=flex",
    "training.seq_len=2048",
    "training.local_batch_size=4",
    "training.steps=30",
    "data=embedded",
    "logger=none",
)


@dataclass(frozen=True)
class Case:
    name: str
    overrides: tuple[str, ...]


CASES = (
    Case("native-0.6B", ("backend=native", "model=0.6B")),
    Case("native-1.7B", ("backend=native", "model=1.7B")),
    Case("hf_v5-0.6B", ("backend=hf_v5", "model=0.6B")),
    Case("hf_v5-1.7B", ("backend=hf_v5", "model=1.7B")),
    Case("moe-30B-A3B-4L", ("backend=nki_moe", "model=30B-A3B", "model.n_layers=4", "backend.kernels=grouped_mm")),
)


def case_overrides(case: Case, extra: list[str]) -> list[str]:
    """The case's overrides, as its command line passes them."""
    return [*COMMON, *case.overrides, *extra]


def command(case: Case, extra: list[str], run_dir: Path) -> list[str]:
    return [sys.executable, "-m", "qwen3_trn", *case_overrides(case, extra), f"hydra.run.dir={run_dir}"]


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(cmd, check=False, cwd=REPO, capture_output=True, text=True, env=env)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", nargs="+", default=[c.name for c in CASES], choices=[c.name for c in CASES])
    parser.add_argument("--dry-run", action="store_true", help="print the commands only")
    parser.add_argument("--plan", action="store_true", help="run each case with mode=plan (validates, trains nothing)")
    parser.add_argument("--out", type=Path, default=None, help="keep the run directories here")
    parser.add_argument("overrides", nargs="*", help="extra key=value overrides for every case")
    args = parser.parse_args()
    cases = [case for case in CASES if case.name in args.cases]
    extra = [*args.overrides, *(["mode=plan"] if args.plan else [])]
    out = args.out or Path(tempfile.mkdtemp(prefix="qwen3_trn_cuda_suite_"))

    if args.dry_run:
        for case in cases:
            print(f"{case.name}: {shlex.join(command(case, extra, out / case.name))}")
        return
    if not args.plan:
        if not torch.cuda.is_available():
            sys.exit("no CUDA GPU here: use --dry-run to see the commands or --plan to validate them")
        print(f"GPU: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")

    print(f"{'case':16s} {'tokens/s':>10s} {'MFU %':>7s} {'peak GiB':>9s}  run")
    failed = 0
    for case in cases:
        run_dir = out / case.name
        done = _run(command(case, extra, run_dir))
        if done.returncode:
            failed += 1
            print(f"{case.name:16s} FAILED (exit {done.returncode}): {done.stderr.strip().splitlines()[-1:]}")
            continue
        if args.plan:
            print(f"{case.name:16s} {'-':>10s} {'-':>7s} {'-':>9s}  planned: {run_dir / 'plan.txt'}")
            continue
        summary = json.loads((run_dir / "summary.json").read_text())
        print(
            f"{case.name:16s} {summary['tokens_per_s']:10.0f} {summary.get('mfu_pct', float('nan')):7.2f} "
            f"{summary['peak_memory_gib']:9.2f}  {run_dir}"
        )
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
