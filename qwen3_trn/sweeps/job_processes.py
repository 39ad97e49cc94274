"""Jobs of a sweep, each in a child process of its own (a search's concurrent trials).

Hydra's launchers take a batch of jobs and return once all of them ended; a search that keeps
N trials in flight starts each the moment one ends. Here one job is Hydra's ``run_job`` in a
child process, as Hydra's joblib launcher runs it (its ``execute_job``): the sweep's config,
Hydra's context and the task function, cloudpickled through the process's pipe (never a file).
The children fork from a server that imported the run's modules once (``job_server``); each
leads a session of its own, so its ranks are one process group: ``stop_jobs`` interrupts them all
with one signal, and a terminal's Ctrl-C reaches the sweep only, which decides. A job keeps the
host allocator of the sweep's process (the command restarted that under tcmalloc).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Sequence

import cloudpickle
from hydra.core.hydra_config import HydraConfig
from hydra.core.singleton import Singleton
from hydra.core.utils import configure_log, run_job, setup_globals
from omegaconf import open_dict

from qwen3_trn.common.fork_server import fork_server, start_child
from qwen3_trn.run import worker

# How long an interrupted job has to record its end before it is killed.
STOP_GRACE_S = 30.0


@dataclass
class JobProcess:
    num: int
    process: multiprocessing.process.BaseProcess
    started: float = field(default_factory=time.time)

    @property
    def ended(self) -> bool:
        return self.process.exitcode is not None


@contextmanager
def job_server() -> Iterator[None]:
    """The fork server the jobs started in this block fork from (the run's modules imported once)."""
    with fork_server([worker.__name__]):
        yield


def start_job(num: int, overrides: Sequence[str], hydra_context: Any, config: Any, task_function: Any) -> JobProcess:
    """Job ``num`` of the sweep (``config``: the sweep's) with ``overrides``, in a new process
    (forked from ``job_server``'s server where one runs, else from one started for it)."""
    payload = cloudpickle.dumps(
        {
            "num": num,
            "overrides": list(overrides),
            "hydra_context": hydra_context,
            "config": config,
            "task_function": task_function,
            "singletons": Singleton.get_state(),
        }
    )
    return JobProcess(num, start_child(_job_main, payload, name=f"sweep job {num}"))


def _signal_group(job: JobProcess, signum: int) -> None:
    try:
        os.killpg(job.process.pid, signum)
    except ProcessLookupError:  # not yet the leader of its session: the process alone
        try:
            os.kill(job.process.pid, signum)
        except ProcessLookupError:
            pass
    except PermissionError:
        pass


def stop_jobs(jobs: Iterable[JobProcess], grace_s: float = STOP_GRACE_S) -> None:
    """Interrupt every job's process group (SIGINT, as Ctrl-C would: runs record ``interrupted``),
    then kill what is left after ``grace_s``."""
    jobs = [job for job in jobs if not job.ended]
    for job in jobs:
        _signal_group(job, signal.SIGINT)
    deadline = time.monotonic() + grace_s
    while any(not job.ended for job in jobs) and time.monotonic() < deadline:
        time.sleep(0.2)
    for job in jobs:
        _signal_group(job, signal.SIGKILL)  # the job's ranks, even where its leader ended
        job.process.join()


def _run_job(job: dict[str, Any]) -> None:
    setup_globals()
    Singleton.set_state(job["singletons"])
    config, num = job["config"], job["num"]
    configure_log(config.hydra.hydra_logging, config.hydra.verbose)
    sweep_config = job["hydra_context"].config_loader.load_sweep_config(config, job["overrides"])
    with open_dict(sweep_config):
        sweep_config.hydra.job.id = num
        sweep_config.hydra.job.num = num
    HydraConfig.instance().set_config(sweep_config)
    result = run_job(
        hydra_context=job["hydra_context"],
        task_function=job["task_function"],
        config=sweep_config,
        job_dir_key="hydra.sweep.dir",
        job_subdir_key="hydra.sweep.subdir",
    )
    _ = result.return_value  # raises where the job failed outside the sweep's own recording


def _job_main(payload: bytes) -> None:
    os.setsid()
    _run_job(cloudpickle.loads(payload))


__all__ = ["JobProcess", "job_server", "start_job", "stop_jobs"]
