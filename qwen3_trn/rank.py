"""``python -m qwen3_trn.rank <run dir>/config.yaml``: one rank from a saved, resolved config.

This is what the torchrun line printed by ``mode=plan`` runs, and what external launchers
start on each node. It never composes with Hydra: the file is the already resolved config.
``--check`` builds rank 0's Trainer on torchtitan's fake collective backend and stops,
which validates large layouts (e.g. 64 ranks) on one CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

from qwen3_trn.config.schema import Mode, RunConfig
from qwen3_trn.devices import probe_device
from qwen3_trn.errors import ConfigError
from qwen3_trn.preflight import resolve
from qwen3_trn.records import load_run_config
from qwen3_trn.worker import WorkerJob, build_trainer, run_worker


def check_layout(cfg: RunConfig) -> dict:
    """Build the Trainer for rank 0 of the planned world with fake collectives (no training)."""
    cfg.mode = Mode.check
    resolved = resolve(cfg)
    world = resolved.layout.world_size
    os.environ.update({"NGPU": str(world), "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": str(world)})
    trainer = build_trainer(cfg, probe_device("cpu"), resolved.layout, fake_backend=True)
    params = sum(p.numel() for m in trainer.model_parts for p in m.parameters())
    local = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for m in trainer.model_parts for p in m.parameters())
    trainer.close()
    torch.distributed.destroy_process_group()
    return {"world_size": world, "parameters": params, "rank0_local_parameters": local, "layout": resolved.layout.describe()}


def run_rank(cfg: RunConfig) -> None:
    """This process's rank of the run (the launcher set RANK, WORLD_SIZE, ...)."""
    resolved = resolve(cfg)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world != resolved.layout.world_size:
        raise ConfigError(
            "launcher",
            f"the launcher started {world} ranks but the config's layout needs {resolved.layout.world_size} ({resolved.layout.describe()}).",
        )
    run_worker(WorkerJob(cfg=cfg, device_type=resolved.device.type, layout=resolved.layout))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m qwen3_trn.rank", description=__doc__.splitlines()[0])
    parser.add_argument("config", help="a resolved config.yaml written by python -m qwen3_trn")
    parser.add_argument("--check", action="store_true", help="build rank 0 on the fake backend, do not train")
    args = parser.parse_args(argv)
    try:
        cfg = load_run_config(args.config)
        if args.check:
            print(json.dumps(check_layout(cfg)))
        else:
            run_rank(cfg)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
