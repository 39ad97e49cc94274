"""``python -m qwen3_trn.rank <run dir>/config.yaml``: one rank from a saved, resolved config.

This is what the torchrun line printed by ``mode=plan`` runs, and what external launchers
start on each node. It never composes with Hydra: the file is the already resolved config.
``--check`` builds rank 0's Trainer on torchtitan's fake collective backend and stops,
which validates large layouts (e.g. 64 ranks) on one CPU.
"""

from __future__ import annotations

import argparse
import os
import sys

from omegaconf import OmegaConf

from qwen3_trn.config.schema import RunConfig
from qwen3_trn.errors import ConfigError


def load_run_config(path: str) -> RunConfig:
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(RunConfig), OmegaConf.load(path)))


def check_layout(cfg: RunConfig) -> dict:
    """Build the Trainer for rank 0 of the planned world with fake collectives (no training)."""
    import torch

    from qwen3_trn.convert import compute_dtype, to_trainer_config
    from qwen3_trn.devices import probe_device
    from qwen3_trn.preflight import prepare

    cfg.mode = "check"
    prepared = prepare(cfg)
    world = prepared.layout.world_size
    os.environ.update({"NGPU": str(world), "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": str(world)})
    cpu = probe_device("cpu")
    cpu.activate(compute_dtype(cfg, cpu))
    trainer_config = to_trainer_config(cfg, cpu, prepared.layout)
    trainer_config.comm.mode = "fake_backend"
    trainer_config.metrics.console_progress = False
    trainer = trainer_config.build()
    params = sum(p.numel() for m in trainer.model_parts for p in m.parameters())
    local = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for m in trainer.model_parts for p in m.parameters())
    trainer.close()
    torch.distributed.destroy_process_group()
    return {"world_size": world, "parameters": params, "rank0_local_parameters": local, "layout": prepared.layout.describe()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m qwen3_trn.rank", description=__doc__.splitlines()[0])
    parser.add_argument("config", help="a resolved config.yaml written by python -m qwen3_trn")
    parser.add_argument("--check", action="store_true", help="build rank 0 on the fake backend, do not train")
    args = parser.parse_args(argv)
    try:
        cfg = load_run_config(args.config)
        if args.check:
            import json

            print(json.dumps(check_layout(cfg)))
            return
        from qwen3_trn.launch.slurm import ON_NODE_ENV
        from qwen3_trn.preflight import prepare
        from qwen3_trn.worker import WorkerJob, run_worker

        os.environ.setdefault(ON_NODE_ENV, "1")  # a rank runs here even if launcher=slurm planned it: no submission checks
        prepared = prepare(cfg)
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world != prepared.layout.world_size:
            raise ConfigError("launcher", f"the launcher started {world} ranks but the config's layout needs {prepared.layout.world_size} ({prepared.layout.describe()}).")
        run_worker(WorkerJob(cfg=cfg, device_type=prepared.device.type, layout=prepared.layout))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
