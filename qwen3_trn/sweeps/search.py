"""Hyperparameter search: the project's sweeper on Optuna (``hydra/sweeper=qwen3_trn_search``).

``python -m qwen3_trn hparams_search=tiny_lr`` (a file in ``conf/hparams_search/``) runs
``hydra.sweeper.n_trials`` trials, each a job of the sweep like any other (its number, its run
directory, its job.json, the manifest and the comparison report), minimising the final
validation loss (``val_loss`` of the run's summary; ``direction: maximize`` is allowed too).

- **Search space.** ``hydra.sweeper.params`` (and sweep overrides on the command line) in
  Hydra's own override grammar, mapped to Optuna distributions: ``interval(a, b)`` a float,
  ``range(a, b[, step])`` an int (Hydra's end is exclusive), ``choice(...)`` or ``a,b,c`` a
  categorical; ``tag(log, ...)`` samples on a log scale. Other overrides apply to every trial.
- **Ask and tell.** Each trial is asked from the study, its overrides composed and checked by
  sweep preflight (``CheckedSweeper._check``): an invalid one is told *failed* and never started
  (its job.json says skipped, invalid). A valid one runs; its outcome is told: its final
  validation loss, *pruned*, or *failed*.
- **Pruning.** ``hydra.sweeper.pruner`` (``{name: median|percentile|successive_halving|
  hyperband|threshold|none, ...Optuna's arguments}``) is stored with the study; each trial's metrics
  rank reports every validation loss to its trial and stops the run when the pruner says so
  (``qwen3_trn.run.trials``): status ``pruned`` in its summary, job.json and the manifest.
- **Concurrent trials.** ``hydra.sweeper.n_concurrent`` (default 1) trials are in flight at
  once; a new one is asked the moment one ends (completed, pruned, failed), never at a batch's
  end. With more than one, or with ranks on other machines (``launcher=slurm``), each trial's job
  runs in a process of its own (``qwen3_trn.sweeps.job_processes``: Hydra's job in a child process,
  whatever ``hydra/launcher``; for Slurm that process submits the job, which is then followed by
  its state); one local trial at a time runs in this process, as any sweep job.
  Concurrent local trials share the machine's devices through packing: each claims
  ``launcher.devices_per_job`` devices (set to devices / ``n_concurrent`` where it is 0). With
  ``launcher=slurm`` they are N Slurm jobs in flight, each followed to its end
  (``launcher.wait=true``); with ``launcher.wait=false`` the command submits up to N (counting
  those an earlier invocation left in flight) and returns, and the next invocation settles them
  and goes on (with ``launcher.wait=true`` it follows them to their end).
- **Storage.** Local trials: SQLite in ``<sweep dir>/optuna.db``. Ranks on other machines
  (``launcher=slurm``): Optuna's journal file ``<sweep dir>/optuna.journal`` on the shared
  filesystem (file locks, no server). ``hydra.sweeper.storage`` names another: a database URL
  (``'mysql+pymysql://user:password@host/db'``, ``postgresql://...``: many workers at once), or a
  journal file's path. The trials open the same storage (``sweep.trial.storage``: the URL without
  its password). A URL's password is taken out of it at the start: the trials get it in their
  environment (``QWEN3_TRN_STORAGE_PASSWORD``, which Slurm passes on to the job), and it is
  redacted wherever the URL is written or printed (``qwen3_trn.common.redact``); a URL given without a
  password takes it from that variable.
- **Resume.** Rerunning the command with ``hydra.sweep.dir=<that dir>`` loads the study: trials
  this sweep's earlier invocation left running are settled from their job records (one whose
  process was killed hard or whose node was lost reads as died: told failed), and only the trials
  still missing up to ``n_trials`` run (every trial counts, failed ones included). A trial whose job
  is still queued or running on Slurm stays running in the study and is settled later.
- **Ctrl-C** stops every trial in flight (local: their process groups, interrupted, killed after
  30 s; Slurm: ``scancel``) and tells the study each one's end (interrupted: failed) before the
  command exits 130; a rerun goes on from there with every trial in the study once.
- **Wall times.** Each trial's user attributes ``started`` and ``ended`` are its job's wall-clock
  start and end (job.json); Optuna's ``datetime_start``/``datetime_complete`` are when it was asked
  and told, which with concurrent trials includes each job's process start and the wait for its
  turn to be told.
- **Reports.** ``<sweep dir>/search.html`` / ``search.md`` and ``best.yaml``
  (``qwen3_trn.report.search``); the storage opens in ``optuna-dashboard``.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, Override, RangeSweep
from omegaconf import OmegaConf, open_dict
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState

from qwen3_trn.common.errors import ConfigError
from qwen3_trn.common.redact import redact_argv, redact_overrides, redact_url, remember, scrub
from qwen3_trn.config.overrides import SEEDS_KEY
from qwen3_trn.config.schema import Mode
from qwen3_trn.launch import Launcher, launcher_of
from qwen3_trn.report.search import write_search_report
from qwen3_trn.results.records import IN_FLIGHT_STATUSES, scrub_hydra_files
from qwen3_trn.run.trials import (
    PRUNER_ATTR,
    RUN_DIR_ATTR,
    STORAGE_PASSWORD_ENV,
    WALL_TIME_ATTRS,
    make_pruner,
    make_sampler,
    study_storage,
    without_password,
)
from qwen3_trn.sweeps.job_processes import JobProcess, job_server, start_job, stop_jobs
from qwen3_trn.sweeps.sweep import collect_jobs, rerun_command, settle_jobs, start_sweep_record, sweep_seeds
from qwen3_trn.sweeps.sweeper import CheckedSweeper, JobCheck

STORAGE_FILE = "optuna.db"
# The default storage where the trials run on other machines (launcher=slurm): Optuna's journal
# in the shared sweep directory.
JOURNAL_FILE = "optuna.journal"
# How often a trial's job elsewhere is looked at while it is followed.
FOLLOW_POLL_S = 3.0
# The overrides that tell a job which study it is a trial of (qwen3_trn.config.schema.TrialConfig);
# it finds its trial by its run directory (the trial's user attribute run_dir).
TRIAL_KEY = "sweep.trial"


def distribution(override: Override) -> BaseDistribution:
    """The Optuna distribution of one sweep override in Hydra's grammar."""
    key = override.get_key_element()
    sweep = override.value()
    tags = set(getattr(sweep, "tags", ()) or ())
    log = "log" in tags
    if isinstance(sweep, IntervalSweep):
        low, high = sweep.start, sweep.end
        if "int" in tags:
            return IntDistribution(int(low), int(high), log=log)
        return FloatDistribution(float(low), float(high), log=log)
    if isinstance(sweep, RangeSweep):
        start, stop, step = sweep.start, sweep.stop, sweep.step
        if all(float(v).is_integer() for v in (start, stop, step)):
            start, stop, step = int(start), int(stop), int(step)
            last = start + step * ((stop - start - 1) // step)
            return IntDistribution(start, last, log=log, step=1 if log else step)
        last = start + step * int((stop - start) / step - 1e-9)
        return FloatDistribution(float(start), float(last), step=None if log else float(step), log=log)
    if isinstance(sweep, ChoiceSweep):
        return CategoricalDistribution(list(override.sweep_string_iterator()))
    raise ConfigError(key, f"{override.input_line}: a search takes interval(...), range(...) or choice(...), not {type(sweep).__name__}.")


def _format(value: Any) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def search_space(overrides: list[Override]) -> tuple[dict[str, BaseDistribution], list[str]]:
    """The search space (sweep overrides) and the overrides every trial shares (the others)."""
    space, fixed = {}, []
    for override in overrides:
        key = override.get_key_element()
        if override.is_sweep_override():
            space[key] = distribution(override)
        else:
            fixed.append(f"{key}={override.get_value_element_as_str()}")
    return space, fixed


def _quoted(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


@dataclass
class RunningTrial:
    """A trial this invocation follows and has not told yet."""

    number: int
    run_dir: Path
    launcher: Launcher
    process: JobProcess | None = None  # its job's process here; None: it ran in this process, or is followed
    # its run is a job elsewhere (a Slurm job its process submitted, or an earlier invocation did),
    # followed through its launcher's ``refresh`` to its end
    followed: bool = False
    _next_look: float = 0.0

    def ended(self) -> bool:
        if self.process is not None:
            return self.process.ended
        if not self.followed:
            return True
        if time.monotonic() < self._next_look:
            return False
        self._next_look = time.monotonic() + FOLLOW_POLL_S
        summaries = self.launcher.refresh([self.run_dir])
        return not summaries or summaries[0].get("status") not in IN_FLIGHT_STATUSES


class SearchSweeper(CheckedSweeper):
    """Optuna's ask-and-tell over the project's sweep jobs, up to ``n_concurrent`` at once
    (module docstring)."""

    def __init__(
        self,
        n_trials: int = 10,
        n_concurrent: int = 1,
        direction: str = "minimize",
        study_name: str | None = None,
        storage: str | None = None,
        sampler: Any = None,
        pruner: Any = None,
        params: dict[str, str] | None = None,
        max_batch_size: int | None = None,
    ) -> None:
        super().__init__(max_batch_size=max_batch_size, params=params)
        self.n_trials = int(n_trials)
        self.n_concurrent = int(n_concurrent)
        self.direction = str(direction)
        self.study_name = study_name
        self.storage = storage
        self.sampler_spec = _plain(sampler)
        self.pruner_spec = _plain(pruner)

    def sweep(self, arguments: list[str]) -> Any:
        assert self.config is not None and self.launcher is not None and self.hydra_context is not None
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        sweep_dir = Path(str(self.config.hydra.sweep.dir)).resolve()
        try:
            space, fixed = search_space(parser.parse_overrides([*self._parse_config(), *arguments]))
            if not space:
                raise ConfigError(
                    "hydra.sweeper.params", "this search has no search space: give interval(...), range(...) or choice(...) values."
                )
            if sweep_seeds(self.config) > 1:
                raise ConfigError(SEEDS_KEY, "a search runs each trial once; leave sweep.seeds out (grid sweeps replicate their jobs).")
            sampler, pruner = make_sampler(self.sampler_spec), make_pruner(self.pruner_spec)
            self.sweep_launcher = launcher_of(self.config.get("launcher"))
            storage = self._storage_spec(sweep_dir)
            name = self.study_name or "search"
            sweep_dir.mkdir(parents=True, exist_ok=True)
            study, resumed = _open_study(storage, name, self.direction, sampler, pruner)
        except ConfigError as exc:
            print(f"error: {exc}", file=sys.stderr, flush=True)
            sys.exit(2)
        study.set_user_attr(PRUNER_ATTR, self.pruner_spec)
        study.set_user_attr("sweep_dir", str(sweep_dir))

        start_sweep_record(self.config, resumed=resumed)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        scrub_hydra_files(sweep_dir)
        if resumed:
            self._settle(study, sweep_dir)
            print(f"[search] study {name} resumed from {storage}: {_counts(study)}", flush=True)

        trial_keys = [f"{TRIAL_KEY}.storage={_quoted(storage)}", f"{TRIAL_KEY}.study={_quoted(name)}"]
        with job_server():  # started by the first trial in a process of its own
            self._run_trials(study, space, [*fixed, *trial_keys], sweep_dir)

        jobs = _jobs(sweep_dir)
        report = write_search_report(study, sweep_dir, jobs, rerun_command)
        print(f"[search] study {name}: {_counts(study)}", flush=True)
        if report["best"]:
            print(
                f"[search] best: trial {report['best']['trial']}, value {report['best']['value']:.6g}: {sweep_dir / 'best.yaml'}",
                flush=True,
            )
        print(f"[search] report: {report['html']}; dashboard: optuna-dashboard {storage}", flush=True)
        return []

    # --- storage ----------------------------------------------------------------------------

    def _storage_spec(self, sweep_dir: Path) -> str:
        """The study's storage as the trials name it (a URL without its password, or a journal
        file); a URL's password goes to ``STORAGE_PASSWORD_ENV`` of this process, which its
        trials (local processes, Slurm jobs) inherit, and out of the config every file is
        written from."""
        if self.storage:
            spec, password = without_password(str(self.storage))
        else:
            elsewhere = not self.sweep_launcher.ranks_here
            spec, password = str(sweep_dir / JOURNAL_FILE) if elsewhere else f"sqlite:///{sweep_dir / STORAGE_FILE}", None
        if password is not None:
            os.environ[STORAGE_PASSWORD_ENV] = password
            remember([password])
            redact_argv()
            with open_dict(self.config):
                self.config.hydra.sweeper.storage = spec
                for kind in ("hydra", "task"):
                    overrides = self.config.hydra.overrides.get(kind) or []
                    self.config.hydra.overrides[kind] = redact_overrides(overrides)
        return spec

    # --- the trials -------------------------------------------------------------------------

    def _run_trials(self, study: optuna.Study, space: dict[str, BaseDistribution], fixed: list[str], sweep_dir: Path) -> None:
        """Up to ``n_concurrent`` trials in flight, a new one asked as soon as one ends, until the
        study has ``n_trials``; Ctrl-C stops those in flight and tells the study their end."""
        running = self._follow_earlier(study, sweep_dir)
        try:
            while True:
                while len(study.trials) < self.n_trials and len(running) + self._detached(study, running, sweep_dir) < self.n_concurrent:
                    self._start_next(study, space, fixed, sweep_dir, running)
                ended = _wait_first(running)
                if not ended:
                    break
                for number in ended:
                    if self._finish(study, running[number], sweep_dir):
                        del running[number]
        except KeyboardInterrupt:
            self._stop(study, list(running.values()), sweep_dir)
            raise
        waiting = self._detached(study, running, sweep_dir)
        if waiting:
            print(f"[search] {waiting} trial(s) still in flight elsewhere; the next invocation settles them", flush=True)

    def _start_next(
        self, study: optuna.Study, space: dict[str, BaseDistribution], fixed: list[str], sweep_dir: Path, running: dict[int, RunningTrial]
    ) -> None:
        """Ask a trial; refuse it (told failed) or start it."""
        trial = study.ask(space)
        overrides = [*fixed, *(f"{key}={_format(value)}" for key, value in trial.params.items())]
        job = self._check(trial.number, overrides, sweep_dir)
        if self.n_concurrent > 1 and job.prepared is not None and _unpacked(job):
            # concurrent local trials share this machine's devices: a slice each
            share = max(1, job.prepared.device.count // self.n_concurrent)
            fixed.append(f"launcher.devices_per_job={share}")
            overrides.append(fixed[-1])
            job = self._check(trial.number, overrides, sweep_dir)
        if job.invalid or (job.prepared is not None and job.prepared.cfg.mode != Mode.train):
            self._refuse(study, trial, job, sweep_dir)
            return
        run_dir = Path(job.prepared.cfg.output_dir).resolve()
        # how the job finds its trial (the same overrides for every trial: nothing more "swept")
        trial.set_user_attr(RUN_DIR_ATTR, str(run_dir))
        print(
            f"[search] trial {trial.number}/{self.n_trials}: {' '.join(f'{k}={_format(v)}' for k, v in trial.params.items())}",
            flush=True,
        )
        started = RunningTrial(trial.number, run_dir, job.launcher)
        running[trial.number] = started
        if self.n_concurrent > 1 or not job.launcher.ranks_here:  # Ctrl-C then stops its process, and cancels its job
            started.process = start_job(trial.number, overrides, self.hydra_context, self.config, self.launcher.task_function)
        else:
            self._launch([(trial.number, overrides)])

    def _finish(self, study: optuna.Study, trial: RunningTrial, sweep_dir: Path, stopping: bool = False) -> bool:
        """A trial whose job ended here, or was submitted elsewhere: told its outcome (True), or
        followed on to its end where its launcher waits for its jobs (False). ``stopping``: its
        job was stopped; wait for the end."""
        record = _jobs(sweep_dir).get(trial.number)
        if record and record.get("status") in IN_FLIGHT_STATUSES:  # a process that died reads as died here
            record = settle_jobs([record], wait=stopping and trial.launcher.waits_for_jobs)[0]
        if record and record.get("status") in IN_FLIGHT_STATUSES and trial.launcher.waits_for_jobs and not stopping:
            trial.process, trial.followed = None, True
            return False
        if trial.process is not None and record is None:
            print(
                f"[search] trial {trial.number}: its process ended ({trial.process.process.exitcode}) before it recorded anything",
                flush=True,
            )
        self._tell(study, trial.number, record)
        return True

    def _stop(self, study: optuna.Study, trials: list[RunningTrial], sweep_dir: Path) -> None:
        """Ctrl-C: every trial in flight stopped (its jobs elsewhere cancelled, its processes
        interrupted), then told how it ended, so that a rerun finds each trial once, settled."""
        if not trials:
            return
        print(f"\n[search] interrupted: stopping {len(trials)} trial(s) in flight", flush=True)
        stop_jobs([trial.process for trial in trials if trial.process is not None])
        for trial in trials:  # after their processes: a job one submitted as it stopped is cancelled too
            trial.launcher.stop([trial.run_dir])
        for trial in trials:
            self._finish(study, trial, sweep_dir, stopping=True)
        print(f"[search] stopped; rerun the command with hydra.sweep.dir={sweep_dir} to go on: {_counts(study)}", flush=True)

    def _follow_earlier(self, study: optuna.Study, sweep_dir: Path) -> dict[int, RunningTrial]:
        """Trials an earlier invocation submitted elsewhere and left in flight, followed to their
        end here where the launcher now waits for its jobs (``launcher.wait=true``)."""
        if not self.sweep_launcher.waits_for_jobs:
            return {}
        jobs, followed = _jobs(sweep_dir), {}
        for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            record = jobs.get(t.number) or {}
            if _in(sweep_dir, t.user_attrs.get(RUN_DIR_ATTR)) and record.get("status") in IN_FLIGHT_STATUSES:
                followed[t.number] = RunningTrial(t.number, Path(t.user_attrs[RUN_DIR_ATTR]), self.sweep_launcher, followed=True)
                print(
                    f"[search] trial {t.number}: following its {(record.get('job') or {}).get('label', 'job')}, submitted earlier",
                    flush=True,
                )
        return followed

    @staticmethod
    def _detached(study: optuna.Study, running: dict[int, RunningTrial], sweep_dir: Path) -> int:
        """Trials of this sweep still in flight elsewhere that no process here follows (Slurm jobs
        submitted with ``launcher.wait=false``): they hold places of ``n_concurrent``."""
        numbers = [
            t.number
            for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
            if t.number not in running and _in(sweep_dir, t.user_attrs.get(RUN_DIR_ATTR))
        ]
        if not numbers:
            return 0
        jobs = _jobs(sweep_dir)
        return sum(1 for n in numbers if (jobs.get(n) or {}).get("status") in IN_FLIGHT_STATUSES)

    def _refuse(self, study: optuna.Study, trial: optuna.trial.Trial, job: JobCheck, sweep_dir: Path) -> None:
        """A trial whose sampled config is invalid: told failed, recorded as skipped, not started."""
        problem = job.problem or ConfigError("mode", "a search trains: mode=train")
        job.problem = problem
        trial.set_user_attr("invalid", str(problem))
        study.tell(trial, state=TrialState.FAIL)
        self._record_skipped(job, sweep_dir, "the search's trial is invalid; told failed, not started")

    @staticmethod
    def _tell(study: optuna.Study, number: int, record: dict[str, Any] | None) -> None:
        """Tell the study a trial's outcome from its job record (in flight elsewhere: nothing),
        with the wall times its job recorded (``started``, ``ended``)."""
        record = record or {}
        status = record.get("status")
        value = (record.get("final") or {}).get("val_loss")
        if status in IN_FLIGHT_STATUSES:
            return
        trial_id = study._storage.get_trial_id_from_study_id_trial_number(study._study_id, number)
        if study._storage.get_trial(trial_id).state != TrialState.RUNNING:
            return  # told already (once only)
        trial = optuna.trial.Trial(study, trial_id)
        for key in WALL_TIME_ATTRS:
            if record.get(key) is not None:
                trial.set_user_attr(key, float(record[key]))
        if status == "completed" and value is not None:
            study.tell(number, float(value))
        elif status == "pruned":
            study.tell(number, state=TrialState.PRUNED)
        else:
            study.tell(number, state=TrialState.FAIL)  # failed, interrupted, died, skipped, no val_loss, never started

    def _settle(self, study: optuna.Study, sweep_dir: Path) -> None:
        """Trials of this sweep an earlier invocation left running: told what their job records say
        (a trial of another sweep sharing the study is its own sweep's business)."""
        running = [
            t.number
            for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
            if t.user_attrs.get(RUN_DIR_ATTR) is None or _in(sweep_dir, t.user_attrs[RUN_DIR_ATTR])
        ]
        if not running:
            return
        jobs = {int(j["num"]): j for j in settle_jobs(collect_jobs(sweep_dir)) if j.get("num") is not None}
        for number in running:
            self._tell(study, number, jobs.get(number))


def _wait_first(running: dict[int, RunningTrial], poll_s: float = 0.2) -> list[int]:
    """Block until a trial of ``running`` ended (none when nothing runs); the numbers of those that have."""
    while running:
        ended = [number for number, trial in running.items() if trial.ended()]
        if ended:
            return ended
        time.sleep(poll_s)
    return []


def _open_study(storage: str, name: str, direction: str, sampler: Any, pruner: Any) -> tuple[optuna.Study, bool]:
    """The study (created, or loaded where it exists) and whether it existed."""
    try:
        opened = study_storage(storage)
        resumed = name in optuna.get_all_study_names(opened)
        study = optuna.create_study(
            study_name=name, storage=opened, direction=direction, sampler=sampler, pruner=pruner, load_if_exists=True
        )
    except Exception as exc:  # noqa: BLE001 - a driver missing, a server not reached, a file not writable
        raise ConfigError(
            "hydra.sweeper.storage", f"Optuna cannot open the study's storage {storage}: {scrub(redact_url(str(exc)))[:500]}"
        ) from None
    return study, resumed


def _unpacked(job: JobCheck) -> bool:
    """A trial whose ranks run here without a device slice of its own (``launcher.devices_per_job=0``)."""
    return job.launcher is not None and job.launcher.ranks_here and getattr(job.launcher.config, "devices_per_job", None) == 0


def _in(sweep_dir: Path, run_dir: str | None) -> bool:
    return run_dir is not None and Path(sweep_dir) in Path(run_dir).parents


def _plain(node: Any) -> dict[str, Any]:
    if node is None:
        return {}
    return dict(OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node)


def _jobs(sweep_dir: Path) -> dict[int, dict[str, Any]]:
    return {int(j["num"]): j for j in collect_jobs(sweep_dir) if j.get("num") is not None}


def _counts(study: optuna.Study) -> str:
    states = [t.state for t in study.trials]
    parts = [f"{states.count(s)} {s.name.lower()}" for s in TrialState if states.count(s)]
    return f"{len(states)} trials ({', '.join(parts) or 'none'})"


__all__ = ["SearchSweeper", "distribution", "search_space"]
