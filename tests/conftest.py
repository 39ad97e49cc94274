"""Shared helpers: configs composed as the command composes them, the session's shared runs, how
the workers share the suite, wandb's offline runs read back. Running the command itself:
tests/commands.py."""

from __future__ import annotations

import compileall
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig
from xdist.scheduler import LoadFileScheduling

from qwen3_trn import groups  # noqa: F401  (every option's class, which its Config builds)
from qwen3_trn.config.store import register_schema
from qwen3_trn.devices import probe_device
from qwen3_trn.results.records import METRICS_FILE, read_metrics
from tests.commands import REPO, command_in_process, command_in_subprocess
from tests.node_agents import free_port, run_node_agents

CONF = REPO / "conf"

register_schema()

# The smallest run (conf/debug/smoke.yaml), long enough for its loss to fall clearly.
FAST = ["debug=smoke", "training.steps=6"]

# A few steps of a run that exports Hugging Face weights (checkpoint=hf_export): the export tests
# (tests/test_hf_export.py, tests/test_hf_v5.py) share one such run per mode (``hf_export_run``).
HF_EXPORT_STEPS = 4
HF_EXPORT_TRAINING = ["debug=smoke", f"training.steps={HF_EXPORT_STEPS}", "validation=off"]
NATIVE_DENSE = ["backend=native", "model=tiny", "checkpoint.hf_interval=2"]  # also exported at step 2
HF_V5_DENSE = ["backend=hf_v5", "model=tiny"]


# One compute thread per process of the suite (this one, the commands and ranks it starts, which
# inherit the variable): the workers, one per core, train at the same time, and OpenMP threads
# that outnumber the cores wait on each other, which makes a training step several times slower.
os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """One worker more than the cores, at most four: much of a test is waiting on processes it
    started (Slurm jobs, node agents, ranks), and the extra worker trains in that time. On a
    2-core machine three workers finish the suite about 5 % sooner than two. Not more: each
    worker may train a model and start ranks of its own."""
    return min(4, (os.cpu_count() or 1) + 1)


# Files whose tests share the session's runs (``shared_run``) run in one worker: the HF exports
# (``hf_export_run``), and the docs' commands with the runs tests/test_training.py reads (the
# default run, debug=smoke). So do the tests on the session's Slurm cluster (their names say
# slurm), so one worker starts one cluster.
SHARED_SCOPES = {
    "tests/test_hf_export.py": "hf_export",
    "tests/test_hf_v5.py": "hf_export",
    "tests/test_docs.py": "docs",
    "tests/test_training.py": "docs",
    # the two-agent run on loopback (``loopback_2x2_run``), also the one-host reference of the 2x2 two-host job
    "tests/test_multinode.py": "tests/test_two_host.py",
    # searches on the two-host cluster: the same cluster, started once
    "tests/test_search_slurm.py": "tests/test_two_host.py",
}
# The longest groups first, longest first (``--durations`` of a full run, summed per group): a
# worker that takes a long group last runs on alone after the others are done. Then the rest,
# most tests first (pytest-xdist's order). Each worker holds two groups at a time.
LONGEST_SCOPES = (
    "tests/test_two_host.py",
    "docs",
    "tests/test_parity.py",
    "tests/test_reliability.py",
    "slurm",
    "tests/test_died_runs.py",
    "tests/test_sweep.py",
    "tests/test_install.py",
    "hf_export",
    "tests/test_titan_compat.py",
    "tests/test_bad_input.py",
    "tests/test_torchtitan_window.py",
    "tests/test_sweep_preflight.py",
    "tests/test_search.py",
)


class SharedRunScheduling(LoadFileScheduling):
    """pytest-xdist's ``--dist loadfile`` (a file's tests in one worker), with the groups above."""

    def _split_scope(self, nodeid: str) -> str:
        path, _, name = nodeid.partition("::")
        if path in SHARED_SCOPES:
            return SHARED_SCOPES[path]
        if "slurm" in path or "slurm" in name:
            return "slurm"
        return SHARED_SCOPES.get(path, path)

    def _assign_work_unit(self, node: Any) -> None:
        for scope in reversed(LONGEST_SCOPES):
            if scope in self.workqueue:
                self.workqueue.move_to_end(scope, last=False)
        super()._assign_work_unit(node)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> SharedRunScheduling:
    return SharedRunScheduling(config, log)


def pytest_configure(config: pytest.Config) -> None:
    """The package's bytecode, written once before any test starts (by the controller, not by
    each worker). Where the environment forbids writing bytecode (PYTHONDONTWRITEBYTECODE=1),
    each of the about 200 commands, node agents and ranks the suite starts would otherwise
    compile qwen3_trn's sources again, about 1 s of CPU a process."""
    if not hasattr(config, "workerinput"):
        compileall.compile_dir(REPO / "qwen3_trn", quiet=1)


def compose_config(overrides: list[str], output_dir: str | Path = "/tmp/qwen3_trn_unused") -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=[*overrides, f"output_dir={output_dir}"])


@pytest.fixture(autouse=True)
def _process_left_as_found() -> Iterator[None]:
    """A test leaves this process's working directory and ``PYTHONPATH`` as it found them: the
    processes later tests start (Slurm jobs, ranks) inherit them."""
    cwd, pythonpath = os.getcwd(), os.environ.get("PYTHONPATH")
    yield
    changed = [
        what
        for what, before, now in (
            ("the working directory", cwd, os.getcwd()),
            ("PYTHONPATH", pythonpath, os.environ.get("PYTHONPATH")),
        )
        if before != now
    ]
    os.chdir(cwd)
    if pythonpath is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = pythonpath
    assert not changed, f"the test changed {', '.join(changed)} of the test process"


@pytest.fixture(autouse=True)
def _random_draws_as_if_first() -> None:
    """Each test draws from torch's global generator as if it were the first test of its process:
    what it draws does not depend on which tests its worker ran before, so a failure reproduces
    when the test runs alone."""
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _device_probes_afresh() -> None:
    """Each test probes the devices afresh: ``probe_device`` is memoized per process, so what one
    test's stand-ins made it find (torch-neuronx's modules, a ``DEVICES`` entry) would otherwise
    answer for later tests in the same worker."""
    probe_device.cache_clear()


def assert_trained(result: subprocess.CompletedProcess, run_dir: Path, steps: int) -> list[dict]:
    """The run exited 0 and logged ``steps`` consecutive steps, one line each; its records."""
    assert result.returncode == 0, f"exit {result.returncode}\nstdout:\n{result.stdout[-3000:]}\nstderr:\n{result.stderr[-3000:]}"
    records = read_metrics(run_dir)
    assert [r["step"] for r in records] == list(range(records[0]["step"], records[0]["step"] + steps))
    assert len((run_dir / METRICS_FILE).read_text().splitlines()) == steps, "a step logged twice"
    return records


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return tmp_path / "run"


@dataclass(frozen=True)
class SharedRun:
    run_dir: Path
    result: subprocess.CompletedProcess


@pytest.fixture(scope="session")
def shared_run(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., SharedRun]:
    """``shared_run(args)``: one run per command line for the whole session, trained by the
    first test that asks for it, for tests that only read what it left (a test that changes a
    run works on a copy in its own tmp_path). In this process (``command_in_process``), or with
    ``cli=True`` as a real ``python -m qwen3_trn`` process (``command_in_subprocess``); ``env``
    is added to the run's environment."""
    runs: dict[tuple, SharedRun] = {}

    def get(args: list[str], cli: bool = False, env: dict | None = None) -> SharedRun:
        key = (tuple(args), cli, tuple(sorted((env or {}).items())))
        if key not in runs:
            run_dir = tmp_path_factory.mktemp("shared_run") / "run"
            run = command_in_subprocess if cli else command_in_process
            result = run(args, run_dir, env=env)
            runs[key] = SharedRun(run_dir, result)
        return runs[key]

    return get


def hf_export_run(shared_run: Callable[..., SharedRun], mode: list[str]) -> SharedRun:
    """The session's tiny run of ``mode`` exporting Hugging Face weights, with DCP checkpoints as
    well (the export check loads the same step into torchtitan), trained in this process."""
    return shared_run([*mode, "checkpoint=hf_export", "checkpoint.enable=true", *HF_EXPORT_TRAINING])


# Two node agents x 2 ranks on this machine over loopback, FSDP: tests/test_multinode.py reads
# it, and tests/test_two_host.py compares the same 4 ranks across two hosts with it.
TWO_BY_TWO_TRAINING = ["debug=smoke", "training.steps=3"]


@pytest.fixture(scope="session")
def loopback_2x2_run(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return run_node_agents(
        tmp_path_factory.mktemp("loopback_2x2"),
        f"127.0.0.1:{free_port()}",
        ["launcher.nproc_per_node=2", "parallelism=fsdp", *TWO_BY_TWO_TRAINING],
    )


# --------------------------------------------------------------------------------------------
# Offline wandb runs, read back with wandb's own tool (`wandb leet inspect`)
# --------------------------------------------------------------------------------------------


@dataclass
class OfflineWandbRun:
    path: Path
    id: str = ""
    name: str = ""
    group: str = ""
    job_type: str = ""
    tags: list[str] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)  # one row per step, "_step" included
    summary: dict[str, Any] = field(default_factory=dict)
    exit_code: int | None = None


def offline_wandb_files(run_dir: Path) -> list[Path]:
    """The run-<id>.wandb files of the offline wandb runs a run directory holds."""
    return sorted(p for p in Path(run_dir).glob("wandb/offline-run-*/run-*.wandb") if not p.parent.is_symlink())


def _leet(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def read_offline_wandb_run(path: Path) -> OfflineWandbRun:
    """What wandb recorded in one offline run: its records as `wandb leet inspect --json` prints
    them (run settings, config, history rows, exit) and its summary (`--summary --json`)."""
    run = OfflineWandbRun(path=Path(path))
    for line in _leet("--json", str(path)).splitlines():
        record = json.loads(line)
        kind = record.get("type")
        if kind == "run":
            body = record["run"]
            run.id, run.name, run.group, run.job_type = (
                body.get("run_id", ""),
                body.get("display_name", ""),
                body.get("run_group", ""),
                body.get("job_type", ""),
            )
            run.tags = list(body.get("tags", []))
            run.config.update((body.get("config") or {}).get("update", {}))
        elif kind == "config":
            run.config.update(record["config"].get("update", {}))
        elif kind == "history":
            row = dict(record["history"].get("item", {}))
            row.setdefault("_step", record["history"].get("step", {}).get("num"))
            run.history.append(row)
        elif kind == "exit":
            run.exit_code = record["exit"].get("exit_code", 0)
    run.config.pop("_wandb", None)
    run.summary = json.loads(_leet("--summary", "--json", str(path)))["summary"]
    return run


# --------------------------------------------------------------------------------------------
# Headless Chromium (CI installs Debian's chromium package)
# --------------------------------------------------------------------------------------------

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not on PATH (CI installs Debian's chromium package)")


def chromium(url: str, profile: Path, *args: str) -> subprocess.CompletedProcess:
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
        "--virtual-time-budget=10000",
    ]
    done = subprocess.run([CHROMIUM, *flags, *args, url], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    return done
