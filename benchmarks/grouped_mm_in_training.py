"""The expert matmuls inside training against the same calls replayed: what new matmul shapes cost.

    python benchmarks/grouped_mm_in_training.py                   # the grouped_mm kernel as it runs
    python benchmarks/grouped_mm_in_training.py --exact-groups    # its groups unpadded on CPU

One process, one Trainer built as ``python -m qwen3_trn backend=nki_moe`` builds it. Every
``torch._grouped_mm`` call is timed; the calls of the last step are kept (inputs copied with
their strides) and, once training is done, replayed in the same process on the same data. On a
CPU whose bf16 matmuls run through oneDNN, a shape oneDNN has not compiled a kernel for costs a
compile: the replay has them all compiled, training has them only if the shape came up before.
``--exact-groups`` turns off the 16-row padding of ``ONEDNN_TOKEN_ALIGNMENT`` (the routing
then changes the shapes every step). Prints the step time and the grouped matmuls' time, median
per block of ten steps, and the matmuls in training against the last step's replayed.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch
from inprocess import single_rank_trainer_config

from qwen3_trn.kernels import moe

DEFAULT_OVERRIDES = ["backend=nki_moe", "model=debugmodel_moe", "model.n_layers=2", "training.seq_len=256", "logger=none"]
BLOCK = 10


def _copy(tensor: torch.Tensor) -> torch.Tensor:
    kept = torch.empty_strided(tensor.size(), tensor.stride(), dtype=tensor.dtype, device=tensor.device)
    return kept.copy_(tensor)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--replays", type=int, default=5)
    parser.add_argument("--exact-groups", action="store_true", help="no 16-row padding for oneDNN")
    parser.add_argument("overrides", nargs="*", default=DEFAULT_OVERRIDES)
    args = parser.parse_args()
    if args.exact_groups:
        moe.ONEDNN_TOKEN_ALIGNMENT = 1

    grouped_mm = torch._grouped_mm
    timed = {"seconds": 0.0, "keep": False, "rows": None}
    kept: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def timed_grouped_mm(a, b, *rest, offs=None, **kwargs):
        start = time.perf_counter()
        out = grouped_mm(a, b, *rest, offs=offs, **kwargs)
        timed["seconds"] += time.perf_counter() - start
        timed["rows"] = timed["rows"] or (a.dtype, moe.grouped_mm_token_alignment(a))
        if timed["keep"]:
            kept.append((_copy(a), _copy(b), offs.clone()))
        return out

    torch._grouped_mm = timed_grouped_mm
    steps, matmuls = [], []
    with tempfile.TemporaryDirectory() as out_dir:
        _, config = single_rank_trainer_config([*args.overrides, f"training.steps={args.steps + 1}"], out_dir)
        trainer = config.build()
        try:
            data = trainer.batch_generator(trainer.dataloader)
            for index in range(args.steps):
                timed.update(seconds=0.0, keep=index == args.steps - 1)
                start = time.perf_counter()
                trainer.step += 1
                trainer.train_step(data)
                steps.append(time.perf_counter() - start)
                matmuls.append(timed["seconds"])
            torch._grouped_mm = grouped_mm
            replays = []
            for _ in range(args.replays):
                start = time.perf_counter()
                for a, b, offs in kept:
                    grouped_mm(a, b, offs=offs)
                replays.append(time.perf_counter() - start)
        finally:
            torch._grouped_mm = grouped_mm
            trainer.close()

    dtype, alignment = timed["rows"]
    print(f"{' '.join(args.overrides)}; {args.steps} steps; matmuls in {dtype}, groups padded to {alignment} row(s)")
    print(f"{'steps':>9s} {'step ms':>8s} {'grouped matmuls ms':>19s}  (medians)")
    for first in range(0, args.steps, BLOCK):
        block = slice(first, first + BLOCK)
        print(
            f"{first + 1:4d}-{min(first + BLOCK, args.steps):<4d} {1e3 * statistics.median(steps[block]):8.0f} {1e3 * statistics.median(matmuls[block]):19.0f}"
        )
    # The kept step copies every input, which disturbs its own timing: compare the steps before it.
    before = matmuls[-BLOCK - 1 : -1]
    in_training, replayed = statistics.median(before), statistics.median(replays)
    print(
        f"the {len(kept)} grouped matmuls of a step: {1e3 * in_training:.0f} ms in training (median of steps "
        f"{args.steps - len(before)}-{args.steps - 1}), {1e3 * replayed:.0f} ms for step {args.steps}'s calls replayed on the "
        f"same inputs ({in_training / replayed:.2f}x)"
    )


if __name__ == "__main__":
    main()
