"""The one owner of the files in run and sweep directories: their names, atomic writers and
readers, statuses, saved configs and the environment variables between the project's processes.
Imports no torch, so the report and the sweep read runs without it. Runs left ``running`` by a
dead process: ``settle_died`` (docs/reliability.md).
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import sys
import tempfile
import time
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Any, Iterator

import yaml
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from qwen3_trn.common.errors import ConfigError
from qwen3_trn.common.redact import redact_dump, redact_overrides, redact_tree, scrub
from qwen3_trn.config.schema import RunConfig
from qwen3_trn.config.typed import run_config_from_container
from qwen3_trn.results.processes import PROCESS_SECTION, is_gone
from qwen3_trn.results.quantities import QUANTITIES, Over, Take

# --- files of a run directory ---
CONFIG_FILE = "config.yaml"
OVERRIDES_FILE = "overrides.yaml"
TRAINER_CONFIG_FILE = "trainer_config.json"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
TRACKING_FILE = "tracking.json"
PLAN_TEXT_FILE = "plan.txt"
PLAN_FILE = "plan.json"
DEVICE_SLICE_FILE = "device_slice.json"
LOGS_DIR = "logs"
# What Hydra itself writes into a run or sweep directory (hydra.output_subdir, the sweep's config).
HYDRA_DUMPS = (".hydra/config.yaml", ".hydra/hydra.yaml", ".hydra/overrides.yaml", "multirun.yaml")
CLAIM_FILE = ".qwen3_trn-run"
# Present in a directory that holds (or held) a run.
RUN_MARKERS = (CLAIM_FILE, CONFIG_FILE, METRICS_FILE, SUMMARY_FILE, "checkpoint")

# --- sections of a run's records ---
# The job a launcher started elsewhere: {"launcher": <name>, "id", "state", "label", "stdout", ...}
JOB_SECTION = "job"

# --- files of a sweep directory and of its jobs ---
SWEEP_FILE = "sweep.json"
# Where a rerun of a sweep moves the directories of the jobs it runs again.
ATTEMPTS_DIR = "previous-attempts"
MANIFEST_FILE = "manifest.json"
JOB_FILE = "job.json"
ERROR_LOG = "error.log"

# --- environment variables between the project's processes ---
# Wall-clock time at which the command started its ranks (seconds to the first step).
LAUNCH_TIME_ENV = "QWEN3_TRN_LAUNCH_TIME"
# Show Python tracebacks for configuration errors.
TRACEBACK_ENV = "QWEN3_TRN_TRACEBACK"
# Machine-wide lock directory of device packing.
SLOTS_DIR_ENV = "QWEN3_TRN_SLOTS_DIR"
# Cache of derived files (HF configs, measured matmul peaks).
CACHE_ENV = "QWEN3_TRN_CACHE"


class RunStatus(str, Enum):
    """What ``summary.json`` (a run) and ``job.json`` (a sweep job) say of it."""

    running = "running"
    completed = "completed"
    failed = "failed"
    interrupted = "interrupted"
    cancelled = "cancelled"
    # launcher=slurm: the job is on the cluster
    submitted = "submitted"
    pending = "pending"
    # mode=plan / mode=check: nothing was trained
    planned = "planned"
    # a sweep job whose settings do not apply to its mode (errors.NotApplicable)
    skipped = "skipped"
    # a trial of a search (hydra/sweeper=qwen3_trn_search) stopped early by its pruner
    pruned = "pruned"
    # recorded running, but its process is verifiably gone: settled by whoever reads it (settle_died)
    died = "died"

    def __str__(self) -> str:
        return self.value

    @property
    def ended(self) -> bool:
        return self in ENDED_STATUSES


ENDED_STATUSES = frozenset(
    {RunStatus.completed, RunStatus.failed, RunStatus.interrupted, RunStatus.cancelled, RunStatus.pruned, RunStatus.died}
)
IN_FLIGHT_STATUSES = frozenset({RunStatus.submitted, RunStatus.pending, RunStatus.running})


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV, Path.home() / ".cache" / "qwen3_trn"))


# ------------------------------------------------------------------------------------------
# Writing
# ------------------------------------------------------------------------------------------


def write_text_atomic(path: Path, text: str) -> None:
    """Readers see the old file or the new one, never half of one; secret values are scrubbed."""
    path = Path(path)
    text = scrub(text)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, record: Any, sort_keys: bool = False) -> None:
    write_text_atomic(path, json.dumps(record, indent=2, default=str, sort_keys=sort_keys) + "\n")


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON record, or None when it is absent or unreadable."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Serialises read-modify-write of ``path`` between processes (a lock file beside it)."""
    lock = Path(path).with_name(f".{Path(path).name}.lock")
    fd = os.open(lock, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


# ------------------------------------------------------------------------------------------
# The run directory
# ------------------------------------------------------------------------------------------


def _claim(run_dir: Path) -> list[str]:
    """Claim ``run_dir`` (exclusive create of ``CLAIM_FILE``); the markers that stop it, if any."""
    taken = [name for name in RUN_MARKERS if (run_dir / name).exists()]
    if taken:
        return taken
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(run_dir / CLAIM_FILE, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return [CLAIM_FILE]
    with os.fdopen(fd, "w") as f:
        f.write(f"{os.getpid()} {time.time()}\n")
    return []


def check_writable_dir(path: str | Path, key: str) -> None:
    """Raises ``ConfigError`` naming ``key`` unless ``path`` is, or can become, a directory this
    process can write in; the probe leaves nothing behind."""
    path = Path(path).expanduser().absolute()
    existing = next(parent for parent in (path, *path.parents) if parent.exists())
    if not existing.is_dir():
        raise ConfigError(key, f"'{path}' cannot be created: '{existing}' is a file, not a directory; choose another {key}.")
    try:
        tempfile.TemporaryDirectory(dir=existing).cleanup()
    except OSError as exc:
        raise ConfigError(
            key, f"'{path}' cannot be created: '{existing}' is not writable ({exc.strerror}); choose a directory you can write to."
        ) from None


class OutputDirCheck(Callback):
    """An unwritable ``hydra.run.dir`` / ``hydra.sweep.dir`` is bad input (exit 2), checked before
    Hydra creates it. Exits itself: Hydra turns a callback's exception into a warning."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._check(str(config.hydra.run.dir), "hydra.run.dir")

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._check(str(config.hydra.sweep.dir), "hydra.sweep.dir")

    @staticmethod
    def _check(path: str, key: str) -> None:
        try:
            check_writable_dir(path, key)
        except ConfigError as exc:
            print(f"error: {exc}", file=sys.stderr, flush=True)
            sys.exit(2)


def claim_run_dir(path: str | Path, fresh_if_taken: bool = False) -> Path:
    """The run directory, claimed for this run alone (an exclusive create, so of two runs started
    at once one wins); ``ConfigError`` if a run already wrote there. ``fresh_if_taken`` (timestamped
    patterns): the loser takes ``<dir>-1``, ``<dir>-2``, ... instead."""
    run_dir = Path(path)
    check_writable_dir(run_dir, "hydra.run.dir")
    taken = _claim(run_dir)
    if not taken:
        return run_dir
    if fresh_if_taken:
        for n in range(1, 10_000):
            candidate = run_dir.with_name(f"{run_dir.name}-{n}")
            if not _claim(candidate):
                return candidate
    raise ConfigError(
        "hydra.run.dir",
        f"'{run_dir}' already holds a run ({', '.join(taken)}); nothing was changed. Choose a new "
        "directory (leave hydra.run.dir unset for a fresh one), or resume it into a new run with "
        f"checkpoint.resume_from={run_dir}.",
    )


def release_run_dir(run_dir: Path) -> None:
    """Undo this process's ``claim_run_dir`` for a run that wrote nothing (an empty directory goes too)."""
    run_dir = Path(run_dir)
    claim = run_dir / CLAIM_FILE
    try:
        owner = claim.read_text().split()[0]
    except (OSError, IndexError):
        return
    if owner == str(os.getpid()):
        claim.unlink(missing_ok=True)
        remove_empty_dirs(run_dir)


def remove_empty_dirs(path: Path, levels: int = 1) -> None:
    """Remove ``path`` and up to ``levels - 1`` of its parents while they are empty (one already
    gone counts as removed)."""
    path = Path(path)
    for _ in range(levels):
        try:
            path.rmdir()
        except FileNotFoundError:
            pass
        except OSError:
            return
        path = path.parent


def prune_empty_dirs(run_dir: Path) -> None:
    """Remove every empty folder below ``run_dir`` once its ranks are done: torchtitan's
    ``comm_traces/`` (written only when a collective times out), wandb's ``tmp/code/``."""
    for folder, _subfolders, files in os.walk(run_dir, topdown=False):
        if Path(folder) != Path(run_dir) and not files:
            try:
                Path(folder).rmdir()  # fails, harmlessly, where a subfolder stayed
            except OSError:
                pass


def holds_run(run_dir: Path) -> bool:
    return any((Path(run_dir) / name).exists() for name in (*RUN_MARKERS, JOB_FILE))


def config_dump(resolved: DictConfig) -> str:
    """The YAML of a resolved config as the run records it: secret values redacted."""
    return OmegaConf.to_yaml(OmegaConf.create(redact_tree(OmegaConf.to_container(resolved, resolve=True, enum_to_str=True))))


def write_run_files(run_dir: Path, resolved: DictConfig, overrides: list[str], trainer_config_dict: dict[str, Any]) -> None:
    write_text_atomic(run_dir / CONFIG_FILE, config_dump(resolved))
    write_text_atomic(run_dir / OVERRIDES_FILE, OmegaConf.to_yaml(OmegaConf.create(redact_overrides(overrides))))
    write_text_atomic(run_dir / TRAINER_CONFIG_FILE, json.dumps(trainer_config_dict, indent=2, default=repr) + "\n")


def scrub_hydra_files(directory: Path) -> None:
    """Hydra's own dumps in ``directory`` rewritten without secrets (``HYDRA_DUMPS``)."""
    for name in HYDRA_DUMPS:
        path = Path(directory) / name
        if not path.is_file():
            continue
        try:
            dumped = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError):
            continue
        redacted = redact_dump(dumped)
        if redacted != dumped:
            write_text_atomic(path, yaml.safe_dump(redacted, sort_keys=False))


def read_overrides(run_dir: Path) -> list[str]:
    path = Path(run_dir) / OVERRIDES_FILE
    return [str(o) for o in OmegaConf.load(path)] if path.is_file() else []


def load_run_config(path: str | Path) -> RunConfig:
    """A run's saved, resolved ``config.yaml`` (or its run directory) as the typed config."""
    path = Path(path)
    if path.is_dir():
        path = path / CONFIG_FILE
    return run_config_from_container(OmegaConf.to_container(OmegaConf.load(path)))


# ------------------------------------------------------------------------------------------
# summary.json: the run's status and headline figures
# ------------------------------------------------------------------------------------------


def job_section(record: dict[str, Any] | None) -> dict[str, Any]:
    """The record's launcher-neutral ``job`` section ({} for a run that started no job elsewhere)."""
    return (record or {}).get(JOB_SECTION) or {}


def job_label(job: dict[str, Any]) -> str:
    """How a job section's job is named in messages (``Slurm job 12``)."""
    return job.get("label") or f"{job.get('launcher')} job {job.get('id')}"


def read_summary(run_dir: Path) -> dict[str, Any]:
    path = Path(run_dir) / SUMMARY_FILE
    return read_json(path) or {}


def update_summary(run_dir: Path, /, **fields: Any) -> dict[str, Any]:
    """Merge ``fields`` into summary.json (the ``job`` section key by key), atomically and
    under a lock: the submitting process, the metrics rank and a launcher's job all update it."""
    path = Path(run_dir) / SUMMARY_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    with _locked(path):
        summary = read_json(path) or {}
        job = fields.pop(JOB_SECTION, None)
        summary.update({k: str(v) if isinstance(v, RunStatus) else v for k, v in fields.items()})
        if job is not None:
            previous = job_section(summary)
            # per-node entries (node_errors: {host: ...}) from the job's nodes are merged, not replaced
            nested = {k: {**previous[k], **v} for k, v in job.items() if isinstance(v, dict) and isinstance(previous.get(k), dict)}
            summary[JOB_SECTION] = {**previous, **job, **nested}
        write_json_atomic(path, summary)
    return summary


def died_fields(record: dict[str, Any], run_dir: Path) -> dict[str, Any] | None:
    """The fields that end a ``running`` record as ``died`` once its process is verifiably gone;
    None while the process may live or cannot be checked (another host)."""
    process = record.get(PROCESS_SECTION) or {}
    if record.get("status") != RunStatus.running or not is_gone(process):
        return None
    figures = died_figures(run_dir)
    return {
        **figures,
        "status": str(RunStatus.died),
        "error": f"process {process.get('pid')} on {process.get('host')} ended without recording an end "
        f"(killed: SIGKILL, the OOM killer, a reboot); last step {figures['last_step'] or '-'}",
        "settled": time.time(),
    }


def died_figures(run_dir: Path) -> dict[str, Any]:
    """The figures of a died run's metrics; ``last_step`` None before the first step."""
    figures = summarize(read_metrics(run_dir))
    return {**figures, "last_step": figures.get("last_step")}


def settle_died(run_dir: Path) -> dict[str, Any]:
    """The run's summary as it now is, ended as ``died`` where ``died_fields`` says so; under the
    summary's lock, so no update of a live run is lost."""
    path = Path(run_dir) / SUMMARY_FILE
    if not path.is_file():
        return {}
    with _locked(path):
        summary = read_json(path) or {}
        fields = died_fields(summary, run_dir)
        if fields:
            summary.update(fields)
            write_json_atomic(path, summary)
    return summary


# ------------------------------------------------------------------------------------------
# metrics.jsonl: one record per logged step
# ------------------------------------------------------------------------------------------


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The run's per-step records in step order; a step logged again after a resume keeps its
    latest record. A torn last line (a killed run) is skipped."""
    path = Path(run_dir) / METRICS_FILE
    by_step: dict[int, dict[str, Any]] = {}
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and "step" in record:
            by_step[int(record["step"])] = record
    return [by_step[step] for step in sorted(by_step)]


# A value missing from a record is taken as this (first, last: None).
_MISSING = {Take.min: math.inf, Take.max: 0.0, Take.mean: 0.0}
_REDUCE = {
    Take.first: lambda values: values[0],
    Take.last: lambda values: values[-1],
    Take.min: min,
    Take.max: max,
    Take.mean: lambda values: sum(values) / len(values),
    Take.count: len,
}


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The run's figures, each taken from its per-step records as ``quantities.QUANTITIES`` says.
    A figure without records to take it from is left out; a run without a training step has
    only its step count, zero."""
    train = [r for r in records if "loss" in r]
    if not train:
        return {k: 0 for k, q in QUANTITIES.items() if q.source and q.source.over == Over.train and q.source.take == Take.count}
    over = {
        Over.train: train,
        Over.steady: [r for r in train[1:] if "tokens_per_s" in r] or train,
        Over.validated: [r for r in records if "val_loss" in r],
    }
    summary = {}
    for key, quantity in QUANTITIES.items():
        source = quantity.source
        if source is None or not over[source.over]:
            continue
        rows = over[source.over]
        taken = rows[:1] if source.take == Take.first else rows[-1:] if source.take == Take.last else rows
        if source.every and not all(source.field in r for r in taken):
            continue
        summary[key] = _REDUCE[source.take]([r.get(source.field, _MISSING.get(source.take)) for r in taken])
    return summary


def write_metrics_summary(run_dir: Path, records: list[dict[str, Any]], facts: dict[str, Any]) -> dict[str, Any]:
    """The metrics rank's part of summary.json: what ran and the figures of its records."""
    return update_summary(run_dir, **facts, **summarize(records), metrics_file=str(Path(run_dir) / METRICS_FILE))


# ------------------------------------------------------------------------------------------
# Sweeps: sweep.json, job.json, manifest.json
# ------------------------------------------------------------------------------------------


def read_sweep_file(sweep_dir: Path) -> dict[str, Any]:
    return read_json(Path(sweep_dir) / SWEEP_FILE) or {}


def write_sweep_file(sweep_dir: Path, shared: dict[str, Any]) -> None:
    write_json_atomic(Path(sweep_dir) / SWEEP_FILE, shared)


def read_job_record(path: Path) -> dict[str, Any] | None:
    """A sweep job's record: ``path`` is its run directory (its job.json) or the record's file."""
    path = Path(path)
    if path.is_dir():
        path = path / JOB_FILE
    return read_json(path)


def write_job_record(run_dir: Path, record: dict[str, Any]) -> None:
    write_json_atomic(Path(run_dir) / JOB_FILE, record)


def job_records(sweep_dir: Path) -> dict[int, dict[str, Any]]:
    """Every job.json under the sweep directory, by job number (earlier attempts left out)."""
    jobs: dict[int, dict[str, Any]] = {}
    for path in sorted(Path(sweep_dir).glob(f"**/{JOB_FILE}")):
        if ATTEMPTS_DIR in path.relative_to(sweep_dir).parts:
            continue
        job = read_job_record(path)
        if job and job.get("num") is not None:
            jobs.setdefault(int(job["num"]), job)
    return jobs


def read_manifest(sweep_dir: Path) -> dict[str, Any] | None:
    path = Path(sweep_dir) / MANIFEST_FILE
    return read_json(path)


def write_manifest_file(sweep_dir: Path, manifest: dict[str, Any]) -> None:
    write_json_atomic(Path(sweep_dir) / MANIFEST_FILE, manifest)


def is_sweep_dir(path: Path) -> bool:
    return (Path(path) / SWEEP_FILE).is_file() or (Path(path) / MANIFEST_FILE).is_file()


def run_dirs_under(path: Path) -> list[Path]:
    """``path`` itself when it is a run directory, else the run directories below it."""
    path = Path(path)
    if (path / SUMMARY_FILE).is_file():
        return [path]
    return sorted({p.parent for p in path.glob(f"**/{SUMMARY_FILE}")})
