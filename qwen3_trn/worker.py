"""What every rank runs: adapt torchtitan to the device, build the Trainer, train.

Ranks receive the already composed and validated ``RunConfig``; they never run Hydra or
read the command line again.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from qwen3_trn.config.schema import RunConfig
from qwen3_trn.layout import Layout


@dataclass(frozen=True)
class WorkerJob:
    cfg: RunConfig
    device_type: str
    layout: Layout


def _configure_logging(cfg: RunConfig, rank: int) -> None:
    """Full torchtitan log (and Python warnings) per rank in <run dir>/logs; the console gets
    only errors, next to the progress view."""
    root = logging.getLogger()
    root.handlers.clear()
    root.setLevel(logging.INFO)
    log_dir = Path(cfg.output_dir) / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    file_handler = logging.FileHandler(log_dir / f"rank{rank}.log")
    file_handler.setFormatter(logging.Formatter(f"[rank{rank}] %(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(file_handler)
    if rank == 0 or cfg.logger.all_ranks_to_console:
        console = logging.StreamHandler(sys.stderr)
        console.setLevel(logging.ERROR)
        console.setFormatter(logging.Formatter(f"[rank{rank}] %(levelname)s: %(message)s"))
        root.addHandler(console)
    logging.captureWarnings(True)
    os.environ.setdefault("KINETO_LOG_LEVEL", "5")


def run_worker(job: WorkerJob) -> None:
    import torch

    from qwen3_trn.backends import get_backend
    from qwen3_trn.convert import compute_dtype, to_trainer_config
    from qwen3_trn.devices import resolve_device

    cfg = job.cfg
    rank = int(os.environ.get("RANK", "0"))
    _configure_logging(cfg, rank)
    device = resolve_device(job.device_type)
    device.activate(compute_dtype(cfg, device))
    get_backend(cfg.backend.name).prepare_process(cfg, device)
    trainer_config = to_trainer_config(cfg, device, job.layout)
    trainer = None
    try:
        trainer = trainer_config.build()
        trainer.train()
    finally:
        if trainer is not None:
            trainer.close()
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
