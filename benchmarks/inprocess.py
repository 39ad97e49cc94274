"""Build the exact Trainer.Config ``python -m qwen3_trn`` would train with, inside this process.

Shared by the benchmark scripts that drive torchtitan's Trainer directly (titan_direct.py,
moe_profile.py): Hydra composition of ``conf/``, the project's validation into a ``RunConfig``,
device activation and ``to_trainer_config``, for a single rank, under the host allocator the
command uses.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from qwen3_trn.common.allocator import exec_with_tcmalloc

# The host allocator the command runs under (qwen3_trn.common.allocator): may restart this script once.
exec_with_tcmalloc()

from hydra import compose, initialize_config_dir
from torchtitan.trainer import Trainer

from qwen3_trn.app import to_run_config
from qwen3_trn.config.schema import RunConfig
from qwen3_trn.config.store import register_schema
from qwen3_trn.devices import resolve_device
from qwen3_trn.launch.node import one_rank_world
from qwen3_trn.run.convert import compute_dtype, to_trainer_config
from qwen3_trn.run.layout import resolve_layout

__all__ = ["REPO", "single_rank_trainer_config"]


def single_rank_trainer_config(overrides: list[str], out_dir: str) -> tuple[RunConfig, Trainer.Config]:
    """The run's ``RunConfig`` and torchtitan ``Trainer.Config`` for one rank on this machine."""
    register_schema()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = to_run_config(compose("config", overrides=[*overrides, f"output_dir={out_dir}"]))
    device = resolve_device(cfg.device.type)
    device.activate(compute_dtype(cfg, device))
    config = to_trainer_config(cfg, device, resolve_layout(cfg.parallelism, 1, 1), cfg.backend.build())
    # The environment the command gives its in-process rank: a free port, not a fixed one that
    # another run may hold (init_process_group then waits on it).
    os.environ.update(one_rank_world())
    return cfg, config
