"""What every rank runs: adapt torchtitan to the device, build the Trainer once, train.

Ranks receive the already composed and validated ``RunConfig`` (and the layout resolved from
it); they never run Hydra or read the command line again. ``build_trainer`` is the one
bootstrap used by the ranks, the fake-backend layout check and the HF round trip.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from qwen3_trn.backends import Backend
from qwen3_trn.common.fork_server import release_fork_server
from qwen3_trn.common.redact import RedactingFormatter, looks_secret
from qwen3_trn.config.schema import RunConfig
from qwen3_trn.devices import DeviceSpec, resolve_device
from qwen3_trn.results.records import LOGS_DIR
from qwen3_trn.run.convert import compute_dtype, to_trainer_config
from qwen3_trn.run.layout import Layout
from qwen3_trn.titan import Trainer


@dataclass(frozen=True)
class WorkerJob:
    cfg: RunConfig
    device_type: str
    layout: Layout
    # The run's backend, built once in the process that resolved the run (its ``config`` is
    # ``cfg.backend``); a rank started in a process of its own receives it with the job.
    backend: Backend


def configure_logging(cfg: RunConfig, rank: int) -> None:
    """Full torchtitan log (and Python warnings) per rank in <run dir>/logs; the console gets
    only errors, next to the progress view."""
    root = logging.getLogger()
    root.handlers.clear()
    root.setLevel(logging.INFO)
    log_dir = Path(cfg.output_dir) / LOGS_DIR
    log_dir.mkdir(parents=True, exist_ok=True)
    file_handler = logging.FileHandler(log_dir / f"rank{rank}.log")
    file_handler.setFormatter(RedactingFormatter(f"[rank{rank}] %(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(file_handler)
    if rank == 0 or cfg.logger.all_ranks_to_console:
        console = logging.StreamHandler(sys.stderr)
        console.setLevel(logging.ERROR)
        console.setFormatter(RedactingFormatter(f"[rank{rank}] %(levelname)s: %(message)s"))
        root.addHandler(console)
    logging.captureWarnings(True)
    os.environ.setdefault("KINETO_LOG_LEVEL", "5")


def build_trainer(
    cfg: RunConfig,
    device: DeviceSpec,
    layout: Layout,
    backend: Backend,
    trainer_config: Trainer.Config | None = None,
    *,
    fake_backend: bool = False,
) -> Trainer:
    """This process's torchtitan Trainer: the device adapted, the mode's per-process setup
    done, the ``Trainer.Config`` built (unless given: the one preflight already built in
    this process, with the same ``backend``) and instantiated. ``fake_backend`` builds it on
    torchtitan's fake collectives (rank 0 of a planned world, nothing trained)."""
    device.activate(compute_dtype(cfg, device))
    backend.prepare_process(cfg, device)
    if trainer_config is None:
        trainer_config = to_trainer_config(cfg, device, layout, backend)
    if fake_backend:
        trainer_config.comm.mode = "fake_backend"
        trainer_config.metrics.console_progress = False
    return trainer_config.build()


# Set by torch elastic's agent (torchrun's engine) in the environment of every rank it starts.
ELASTIC_RANK_ENV = "TORCHELASTIC_RUN_ID"
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_launcher() -> None:
    """A rank that torch elastic's agent started is killed when the agent's process dies.

    torch's multiprocessing asks the kernel for a SIGINT to the ranks when their parent dies; a rank that
    ignores SIGINT (or is deep in a collective that never returns to Python) trains on as an
    orphan after its launcher is killed (SIGKILL, the OOM killer, a job step cancelled hard),
    writing checkpoints that a resume started meanwhile races for. SIGKILL cannot be ignored.
    A rank trained in-process (a one-rank world) is the launching process itself."""
    if ELASTIC_RANK_ENV not in os.environ or not sys.platform.startswith("linux"):
        return
    release_fork_server()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        logging.getLogger(__name__).warning("prctl(PR_SET_PDEATHSIG) failed: errno %d", ctypes.get_errno())
        return
    if os.getppid() == 1:  # the agent was already gone before the signal was armed
        os._exit(1)


def log_placement(cfg: RunConfig) -> str:
    """One line in the rank's log: which host it runs on, and the ``launcher.env`` variables
    as this process has them (secrets as set/unset): on several nodes, what each node gave it."""
    env = ", ".join(
        f"{key}={'<set>' if looks_secret(key) and key in os.environ else os.environ.get(key, '<unset>')}" for key in cfg.launcher.env
    )
    line = (
        f"rank {os.environ.get('RANK', '0')}/{os.environ.get('WORLD_SIZE', '1')} on host {socket.gethostname()} "
        f"(node {os.environ.get('GROUP_RANK', '0')}, local rank {os.environ.get('LOCAL_RANK', '0')}); "
        f"launcher.env here: {env or '(none)'}"
    )
    logging.getLogger(__name__).info(line)
    return line


def run_worker(job: WorkerJob, trainer_config: Trainer.Config | None = None) -> None:
    die_with_launcher()
    cfg = job.cfg
    configure_logging(cfg, int(os.environ.get("RANK", "0")))
    log_placement(cfg)
    trainer = None
    try:
        trainer = build_trainer(cfg, resolve_device(job.device_type), job.layout, job.backend, trainer_config)
        trainer.train()
    finally:
        if trainer is not None:
            trainer.close()
            if torch.distributed.is_initialized():
                torch.distributed.destroy_process_group()
