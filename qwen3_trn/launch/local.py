"""Ranks on this machine: in-process for one rank, PyTorch's elastic launcher otherwise.

The elastic launcher is torchrun's engine: the same c10d rendezvous, restarts and per-rank
log redirection, started from the already composed config instead of a command line.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Iterator

from qwen3_trn.launch.packing import SLICE_BINDERS, DeviceSlots, default_lock_dir
from qwen3_trn.worker import WorkerJob, run_worker


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
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


def rendezvous_endpoint(job: WorkerJob) -> str:
    launcher = job.cfg.launcher
    if launcher.rdzv_endpoint:
        return launcher.rdzv_endpoint
    # A free port of our own, so that concurrent jobs on one machine never share a store.
    return f"127.0.0.1:{_free_port()}"


@contextmanager
def device_slice(job: WorkerJob) -> Iterator[dict[str, str]]:
    """Claim ``launcher.devices_per_job`` devices for this job (waiting while too few are free)
    and yield the environment that confines the job to them; records the slice in the run dir."""
    from qwen3_trn.devices import resolve_device

    count = job.cfg.launcher.devices_per_job
    device = resolve_device(job.device_type)
    slots = DeviceSlots(default_lock_dir(device.type), device.count)
    with slots.claim(count) as claimed:
        record = Path(job.cfg.output_dir) / "device_slice.json"
        started = time.time()
        env = SLICE_BINDERS[device.type](claimed)
        try:
            yield env
        finally:
            record.write_text(json.dumps({"device": device.type, "slots": claimed, "started": started, "finished": time.time()}) + "\n")


def launch_local(job: WorkerJob) -> None:
    packing = device_slice(job) if job.cfg.launcher.devices_per_job > 0 else nullcontext({})
    with packing as slice_env:
        _launch(job, slice_env)


def _launch(job: WorkerJob, slice_env: dict[str, str]) -> None:
    launcher = job.cfg.launcher
    env = {**slice_env, **{key: str(value) for key, value in launcher.env.items()}}
    if job.layout.world_size == 1:
        single_rank = {
            "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
            "GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()),
        }
        with _environment({**env, **single_rank}):
            run_worker(job)
        return

    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
    from torch.distributed.launcher.api import elastic_launch, LaunchConfig

    console_ranks = None if job.cfg.logger.all_ranks_to_console else {0}
    logs = DefaultLogsSpecs(
        log_dir=str(Path(job.cfg.output_dir) / "logs" / "elastic"),
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
        rdzv_backend=launcher.rdzv_backend,
        rdzv_endpoint=rendezvous_endpoint(job),
        max_restarts=launcher.max_restarts,
        monitor_interval=0.5,
        start_method="spawn",
        logs_specs=logs,
    )
    with _environment(env):
        elastic_launch(config, run_worker)(job)
