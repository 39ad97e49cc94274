"""FSDP's one-rank reduce on CPU: torch's default against the CPU adapter's ``ReduceInPlaceAtOneRank``.

    python benchmarks/one_rank_reduce.py                          # debugmodel_moe, 2 layers, nki_moe
    python benchmarks/one_rank_reduce.py --steps 16 backend=native model=debugmodel

One process, one Trainer built as ``python -m qwen3_trn`` builds it; after two warm-up steps the
steps alternate between FSDP's ``DefaultReduceScatter`` and the adapter's reduce (swapped on every
FSDP parameter group between steps), so both see the same model, data and machine state. Prints
the median step time of each and their ratio, with every step's figure.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from inprocess import single_rank_trainer_config
from torch.distributed.fsdp import FSDPModule
from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultReduceScatter

from qwen3_trn.devices.cpu import ReduceInPlaceAtOneRank

DEFAULT_OVERRIDES = ["backend=nki_moe", "model=debugmodel_moe", "model.n_layers=2", "training.seq_len=256", "logger=none"]
WARMUP = 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=16, help="measured steps, alternating (half each)")
    parser.add_argument("overrides", nargs="*", default=DEFAULT_OVERRIDES)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as out_dir:
        _, config = single_rank_trainer_config([*args.overrides, f"training.steps={args.steps + WARMUP + 1}"], out_dir)
        trainer = config.build()
        try:
            groups = [
                group
                for module in trainer.model_parts[0].modules()
                if isinstance(module, FSDPModule)
                for group in module._get_fsdp_state()._fsdp_param_groups
            ]
            data = trainer.batch_generator(trainer.dataloader)
            for _ in range(WARMUP):
                trainer.step += 1
                trainer.train_step(data)
            times: dict[str, list[float]] = {"torch default": [], "in place": []}
            for index in range(args.steps):
                label = "in place" if index % 2 else "torch default"
                for group in groups:
                    group._reduce_scatter_comm = ReduceInPlaceAtOneRank() if index % 2 else DefaultReduceScatter()
                start = time.perf_counter()
                trainer.step += 1
                trainer.train_step(data)
                times[label].append(time.perf_counter() - start)
        finally:
            trainer.close()
    print(f"{' '.join(args.overrides)}; {args.steps} steps alternating after {WARMUP} warm-up steps")
    for label, values in times.items():
        print(f"{label:14s} median {1e3 * statistics.median(values):6.0f} ms  [{', '.join(f'{1e3 * v:.0f}' for v in values)}]")
    ratio = statistics.median(times["torch default"]) / statistics.median(times["in place"])
    print(f"step time, torch default / in place: {ratio:.2f}")


if __name__ == "__main__":
    main()
