"""What runs on a node, whichever launcher started it: the node's ranks of a run (in this
process for a one-rank world, else PyTorch's elastic launcher), the device slice of a packed
job, and the torchrun line that starts the same ranks outside this framework.

The elastic launcher is torchrun's engine: the same c10d rendezvous, restarts and per-rank
log redirection, started from the already composed config instead of a command line. A
launcher that runs ranks elsewhere (a Slurm job) calls ``start_node_ranks`` there.
"""

from __future__ import annotations

import os
import shlex
import socket
import time
import uuid
from contextlib import contextmanager, nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Iterator

from qwen3_trn.common.errors import RunInterrupted
from qwen3_trn.common.fork_server import fork_server
from qwen3_trn.common.redact import looks_secret, passed_env
from qwen3_trn.config.schema import LauncherConfig, RendezvousBackend
from qwen3_trn.devices import resolve_device
from qwen3_trn.launch.packing import SLICE_BINDERS, DeviceSlots, default_lock_dir
from qwen3_trn.results.records import DEVICE_SLICE_FILE, LOGS_DIR, prune_empty_dirs, write_json_atomic
from qwen3_trn.run.layout import Layout
from qwen3_trn.run.worker import WorkerJob, run_worker
from qwen3_trn.titan import Trainer


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def one_rank_world() -> dict[str, str]:
    """The environment torch.distributed reads, for this process as the one rank of its world."""
    return {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_WORLD_SIZE": "1",
        "GROUP_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
    }


@contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def torchrun_command(launcher: LauncherConfig, layout: Layout, config_path: Path, rdzv_backend: str = "c10d") -> str:
    """The torchrun line that starts the same ranks (the seed article's launch pattern)."""
    endpoint = launcher.rdzv_endpoint or ("localhost:0" if layout.nnodes == 1 else "<head-node>:29500")
    parts = [
        "torchrun",
        f"--nnodes={layout.nnodes}",
        f"--nproc_per_node={layout.nproc_per_node}",
        f"--rdzv_backend={rdzv_backend}",
        f"--rdzv_endpoint={endpoint}",
        *([f"--rdzv_id={launcher.rdzv_id}"] if launcher.rdzv_id else []),
        "--local-ranks-filter=0",
        "--role=rank",
        "--tee=3",
        "-m",
        "qwen3_trn.rank",
        str(config_path),
    ]
    # Secret values are not printed: the line takes them from the environment it runs in.
    env = " ".join(f'{key}="${key}"' if looks_secret(key) else f"{key}={shlex.quote(str(value))}" for key, value in launcher.env.items())
    return (env + " " if env else "") + " ".join(parts)


@contextmanager
def device_slice(job: WorkerJob, count: int) -> Iterator[dict[str, str]]:
    """Claim ``count`` devices for this job (waiting while too few are free) and yield the
    environment that confines the job to them; records the slice in the run dir."""
    device = resolve_device(job.device_type)
    slots = DeviceSlots(default_lock_dir(device.type), device.count)
    with slots.claim(count) as claimed:
        started = time.time()
        env = SLICE_BINDERS[device.type](claimed)
        try:
            yield env
        finally:
            write_json_atomic(
                Path(job.cfg.output_dir) / DEVICE_SLICE_FILE,
                {"device": device.type, "slots": claimed, "started": started, "finished": time.time()},
            )


@contextmanager
def _pruned(run_dir: Path) -> Iterator[None]:
    """No empty folder is left in the run directory once this node's ranks are done."""
    try:
        yield
    finally:
        prune_empty_dirs(run_dir)


def start_node_ranks(
    job: WorkerJob, trainer_config: Trainer.Config | None = None, rdzv_backend: str = RendezvousBackend.c10d, devices_per_job: int = 0
) -> None:
    """This node's ranks of the job: in this process for a one-rank world (reusing the
    ``Trainer.Config`` preflight built here, if given), else PyTorch's elastic launcher."""
    launcher = job.cfg.launcher
    packing = device_slice(job, devices_per_job) if devices_per_job > 0 else nullcontext({})
    with packing as slice_env, _pruned(Path(job.cfg.output_dir)):
        env = {**slice_env, **passed_env(launcher.env)}
        if job.layout.world_size == 1:
            with environment({**env, **one_rank_world()}):
                run_worker(job, trainer_config)
            return
        _elastic_launch(job, env, str(rdzv_backend))


def _elastic_launch(job: WorkerJob, env: dict[str, str], rdzv_backend: str) -> None:
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    launcher = job.cfg.launcher
    console_ranks = None if job.cfg.logger.all_ranks_to_console else {0}
    logs = DefaultLogsSpecs(
        log_dir=str(Path(job.cfg.output_dir) / LOGS_DIR / "elastic"),
        redirects=Std.ALL,
        tee=Std.ALL,
        local_ranks_filter=console_ranks,
    )
    config = LaunchConfig(
        min_nodes=launcher.nnodes,
        max_nodes=launcher.nnodes,
        nproc_per_node=job.layout.nproc_per_node,
        role="rank",
        run_id=launcher.rdzv_id or f"qwen3_trn-{uuid.uuid4().hex[:12]}",
        rdzv_backend=rdzv_backend,
        # A free port of our own, so that concurrent jobs on one machine never share a store.
        rdzv_endpoint=launcher.rdzv_endpoint or f"127.0.0.1:{free_port()}",
        max_restarts=launcher.max_restarts,
        monitor_interval=0.5,
        start_method=RANK_START_METHODS.get(job.device_type, "spawn"),
        logs_specs=logs,
    )
    server = fork_server([run_worker.__module__]) if config.start_method == "forkserver" else nullcontext()
    with environment(env), server:
        try:
            elastic_launch(config, run_worker)(job)
        except SignalException as exc:  # the elastic agent stopped every rank on SIGINT/SIGTERM
            raise RunInterrupted(exc.sigval) from None


# How the elastic launcher starts a node's ranks, by device type. CPU ranks fork from a server
# that imported the worker's modules (torch, torchtitan) once, rather than each
# importing them again (about 4 s of CPU a rank). Elsewhere each rank is a fresh interpreter, as
# torchrun starts it: a device runtime must not be loaded before its rank's environment is set.
# Not forked from the launcher itself: a child forked after torch ran an OpenMP-parallel op hangs
# in its first parallel op (GNU OpenMP is not fork-safe), and the launcher may have run some.
RANK_START_METHODS = {"cpu": "forkserver"}


def with_rendezvous(job: WorkerJob, endpoint: str | None, run_id: str) -> WorkerJob:
    """The job with its launcher's rendezvous set (the Slurm job's first node and id)."""
    launcher = replace(
        job.cfg.launcher, rdzv_endpoint=job.cfg.launcher.rdzv_endpoint or endpoint, rdzv_id=job.cfg.launcher.rdzv_id or run_id
    )
    return replace(job, cfg=replace(job.cfg, launcher=launcher))


__all__ = ["environment", "free_port", "one_rank_world", "start_node_ranks", "torchrun_command", "with_rendezvous"]
