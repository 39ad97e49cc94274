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
- **Storage and resume.** The study lives in ``<sweep dir>/optuna.db`` (SQLite; or
  ``hydra.sweeper.storage``). Rerunning the command with ``hydra.sweep.dir=<that dir>`` loads
  it: trials that were running when the earlier invocation stopped are settled from their job
  records (one whose process was killed hard reads as died: told failed), and only the trials still missing up to ``n_trials`` run (every trial counts,
  failed ones included). With ``launcher=slurm`` a trial whose job is still queued or running
  stays running in the study and is settled by the next invocation.
- **Reports.** ``<sweep dir>/search.html`` / ``search.md`` and ``best.yaml``
  (``qwen3_trn.report.search``); the storage opens in ``optuna-dashboard``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import optuna
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, Override, RangeSweep
from omegaconf import OmegaConf
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState

from qwen3_trn.common.errors import ConfigError
from qwen3_trn.config.overrides import SEEDS_KEY
from qwen3_trn.config.schema import Mode
from qwen3_trn.report.search import write_search_report
from qwen3_trn.results.records import IN_FLIGHT_STATUSES, scrub_hydra_files
from qwen3_trn.run.trials import PRUNER_ATTR, RUN_DIR_ATTR, make_pruner, make_sampler
from qwen3_trn.sweeps.sweep import collect_jobs, rerun_command, settle_jobs, start_sweep_record, sweep_seeds
from qwen3_trn.sweeps.sweeper import CheckedSweeper, JobCheck

STORAGE_FILE = "optuna.db"
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


class SearchSweeper(CheckedSweeper):
    """Optuna's ask-and-tell over the project's sweep jobs (module docstring)."""

    def __init__(
        self,
        n_trials: int = 10,
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
        self.direction = str(direction)
        self.study_name = study_name
        self.storage = storage
        self.sampler_spec = _plain(sampler)
        self.pruner_spec = _plain(pruner)

    def sweep(self, arguments: list[str]) -> Any:
        assert self.config is not None and self.launcher is not None and self.hydra_context is not None
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        try:
            space, fixed = search_space(parser.parse_overrides([*self._parse_config(), *arguments]))
            if not space:
                raise ConfigError(
                    "hydra.sweeper.params", "this search has no search space: give interval(...), range(...) or choice(...) values."
                )
            if sweep_seeds(self.config) > 1:
                raise ConfigError(SEEDS_KEY, "a search runs each trial once; leave sweep.seeds out (grid sweeps replicate their jobs).")
            sampler, pruner = make_sampler(self.sampler_spec), make_pruner(self.pruner_spec)
        except ConfigError as exc:
            print(f"error: {exc}", file=sys.stderr, flush=True)
            sys.exit(2)
        sweep_dir = Path(str(self.config.hydra.sweep.dir)).resolve()
        sweep_dir.mkdir(parents=True, exist_ok=True)
        storage = self.storage or f"sqlite:///{sweep_dir / STORAGE_FILE}"
        name = self.study_name or "search"
        resumed = name in optuna.get_all_study_names(storage) if (sweep_dir / STORAGE_FILE).exists() or self.storage else False
        study = optuna.create_study(
            study_name=name, storage=storage, direction=self.direction, sampler=sampler, pruner=pruner, load_if_exists=True
        )
        study.set_user_attr(PRUNER_ATTR, self.pruner_spec)
        study.set_user_attr("sweep_dir", str(sweep_dir))

        start_sweep_record(self.config, resumed=resumed)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        scrub_hydra_files(sweep_dir)
        if resumed:
            self._settle(study, sweep_dir)
            print(f"[search] study {name} resumed from {storage}: {_counts(study)}", flush=True)

        trial_keys = [f"{TRIAL_KEY}.storage={_quoted(storage)}", f"{TRIAL_KEY}.study={_quoted(name)}"]
        while len(study.trials) < self.n_trials:
            trial = study.ask(space)
            overrides = [*fixed, *(f"{key}={_format(value)}" for key, value in trial.params.items()), *trial_keys]
            job = self._check(trial.number, overrides, sweep_dir)
            if job.invalid or (job.prepared is not None and job.prepared.cfg.mode != Mode.train):
                self._refuse(study, trial, job, sweep_dir)
                continue
            # how the job finds its trial (the same overrides for every trial: nothing more "swept")
            trial.set_user_attr(RUN_DIR_ATTR, str(Path(job.prepared.cfg.output_dir).resolve()))
            print(
                f"[search] trial {trial.number}/{self.n_trials}: {' '.join(f'{k}={_format(v)}' for k, v in trial.params.items())}",
                flush=True,
            )
            self._launch([(trial.number, overrides)])
            record = _jobs(sweep_dir).get(trial.number)
            if record and record.get("status") in IN_FLIGHT_STATUSES and job.launcher.waits_for_jobs:
                record = settle_jobs([record], wait=True)[0]  # a launcher that waits for its jobs: their outcome first
            self._tell(study, trial.number, record)

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

    def _refuse(self, study: optuna.Study, trial: optuna.trial.Trial, job: JobCheck, sweep_dir: Path) -> None:
        """A trial whose sampled config is invalid: told failed, recorded as skipped, not started."""
        problem = job.problem or ConfigError("mode", "a search trains: mode=train")
        job.problem = problem
        trial.set_user_attr("invalid", str(problem))
        study.tell(trial, state=TrialState.FAIL)
        self._record_skipped(job, sweep_dir, "the search's trial is invalid; told failed, not started")

    @staticmethod
    def _tell(study: optuna.Study, number: int, record: dict[str, Any] | None) -> None:
        """Tell the study a trial's outcome from its job record (in flight elsewhere: nothing)."""
        status = (record or {}).get("status")
        value = ((record or {}).get("final") or {}).get("val_loss")
        if status in IN_FLIGHT_STATUSES:
            return
        if status == "completed" and value is not None:
            study.tell(number, float(value))
        elif status == "pruned":
            study.tell(number, state=TrialState.PRUNED)
        else:
            study.tell(number, state=TrialState.FAIL)  # failed, interrupted, skipped, no val_loss, never started

    def _settle(self, study: optuna.Study, sweep_dir: Path) -> None:
        """Trials an earlier invocation left running: told what their job records say."""
        running = [t.number for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))]
        if not running:
            return
        jobs = {int(j["num"]): j for j in settle_jobs(collect_jobs(sweep_dir)) if j.get("num") is not None}
        for number in running:
            self._tell(study, number, jobs.get(number))


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
