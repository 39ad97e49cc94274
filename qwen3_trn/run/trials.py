"""Optuna inside a run: the pruner and sampler a search names, and the trial a run reports to.

The search sweeper (``qwen3_trn.sweeps.search``) keeps its study in a storage every job can open
(``study_storage``: a database URL, or the path of a journal file) and records there how it
prunes (the study's user attribute ``pruner``). A job of the search (``sweep.trial`` set) opens the same study with the
same pruner, reports each validation loss to its trial and asks whether to stop
(``TrialReporter.report``); ``TrialPruned`` then ends the run with status ``pruned``.
Nothing here imports torch.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import BaseStorage, JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

from qwen3_trn.common.errors import ConfigError
from qwen3_trn.results.records import RunStatus

# hydra.sweeper.pruner.name -> Optuna's pruner class; the other keys are its arguments.
PRUNERS = {
    "median": optuna.pruners.MedianPruner,
    "percentile": optuna.pruners.PercentilePruner,
    "successive_halving": optuna.pruners.SuccessiveHalvingPruner,
    "hyperband": optuna.pruners.HyperbandPruner,
    "threshold": optuna.pruners.ThresholdPruner,
    "none": optuna.pruners.NopPruner,
}
# hydra.sweeper.sampler.name -> Optuna's sampler class; the other keys are its arguments.
SAMPLERS = {
    "tpe": optuna.samplers.TPESampler,
    "random": optuna.samplers.RandomSampler,
    "cmaes": optuna.samplers.CmaEsSampler,
    "qmc": optuna.samplers.QMCSampler,
}
PRUNER_ATTR = "pruner"
# The password of a study's database URL: the trials get it in their environment, never in a
# file or an override (a secret-looking name: every record writer scrubs its value).
STORAGE_PASSWORD_ENV = "QWEN3_TRN_STORAGE_PASSWORD"
# The trial's user attribute naming the run directory of its job: how a job finds its trial.
RUN_DIR_ATTR = "run_dir"
# The trial's user attributes with its job's wall-clock start and end (seconds since the epoch):
# Optuna's datetime_start/datetime_complete are when the search asked and told it.
WALL_TIME_ATTRS = ("started", "ended")


def _build(kind: str, table: dict[str, Any], spec: dict[str, Any] | None, default: str) -> Any:
    spec = dict(spec or {})
    name = str(spec.pop("name", default))
    if name not in table:
        raise ConfigError(f"hydra.sweeper.{kind}.name", f"unknown {kind} '{name}'; one of: {', '.join(table)}.")
    try:
        return table[name](**spec)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"hydra.sweeper.{kind}", f"Optuna's {table[name].__name__} refused {spec}: {exc}") from None


def make_pruner(spec: dict[str, Any] | None) -> optuna.pruners.BasePruner:
    """``{name: median, n_startup_trials: 2, n_warmup_steps: 4}`` -> ``MedianPruner(...)``."""
    return _build("pruner", PRUNERS, spec, "none")


def make_sampler(spec: dict[str, Any] | None) -> optuna.samplers.BaseSampler:
    """``{name: tpe, seed: 0}`` -> ``TPESampler(seed=0)``."""
    return _build("sampler", SAMPLERS, spec, "tpe")


def is_url(spec: str) -> bool:
    return "://" in str(spec)


def _database_url(spec: str) -> Any:
    """SQLAlchemy's parse of a storage URL. Imported here, not with the module: every process of
    a run imports this module, and SQLAlchemy would cost each 0.4 s of CPU that only a search's
    storage needs."""
    from sqlalchemy.engine import make_url

    return make_url(str(spec))


def without_password(spec: str) -> tuple[str, str | None]:
    """A storage URL without its password, and the password (None where it has none)."""
    if not is_url(spec):
        return str(spec), None
    url = _database_url(spec)
    if url.password is None:
        return str(spec), None
    public = type(url).create(url.drivername, username=url.username, host=url.host, port=url.port, database=url.database, query=url.query)
    return public.render_as_string(hide_password=False), str(url.password)


def study_storage(spec: str) -> str | BaseStorage:
    """What Optuna opens for ``spec``: a database URL (``sqlite:///...``, ``mysql+pymysql://user@host/db``,
    ``postgresql://...``), its password from ``STORAGE_PASSWORD_ENV`` where it names a user but no
    password; anything else is the path of a journal file (``JournalStorage``, for a shared
    filesystem)."""
    if not is_url(spec):
        return JournalStorage(JournalFileBackend(str(spec)))
    password = os.environ.get(STORAGE_PASSWORD_ENV)
    url = _database_url(spec)
    if password and url.username and url.password is None:
        return url.set(password=password).render_as_string(hide_password=False)
    return str(spec)


class TrialPruned(SystemExit):
    """Raised on every rank of a pruned trial: the run ends, its status ``pruned`` (not failed).
    A ``SystemExit``: the run has recorded why (summary.json's ``pruned``), it is no error."""

    run_status = RunStatus.pruned


class TrialReporter:
    """One trial of a study, opened from its storage on first use (by the metrics rank only):
    trial ``number`` when given, else the running trial whose ``run_dir`` is this run's."""

    def __init__(self, storage: str, study: str, number: int | None, run_dir: str) -> None:
        self.storage, self.study_name, self.number, self.run_dir = storage, study, number, str(Path(run_dir).resolve())
        self._trial: optuna.trial.Trial | None = None

    def _open(self) -> optuna.trial.Trial:
        if self._trial is None:
            study = optuna.load_study(study_name=self.study_name, storage=study_storage(self.storage))
            study.pruner = make_pruner(study.user_attrs.get(PRUNER_ATTR))
            trials = study.get_trials(deepcopy=False)
            if self.number is not None:
                found = [t for t in trials if t.number == self.number]
            else:
                found = [t for t in trials if t.state == TrialState.RUNNING and t.user_attrs.get(RUN_DIR_ATTR) == self.run_dir]
            if not found:
                raise ConfigError("sweep.trial", f"study {self.study_name} ({self.storage}) has no running trial for {self.run_dir}.")
            self.number = found[-1].number
            self._trial = optuna.trial.Trial(study, found[-1]._trial_id)
        return self._trial

    def report(self, value: float, step: int) -> bool:
        """Report a validation loss at ``step``; whether the pruner stops the trial here."""
        trial = self._open()
        trial.report(value, step)
        return trial.should_prune()


__all__ = [
    "PRUNER_ATTR",
    "PRUNERS",
    "RUN_DIR_ATTR",
    "SAMPLERS",
    "STORAGE_PASSWORD_ENV",
    "TrialPruned",
    "TrialReporter",
    "make_pruner",
    "make_sampler",
    "study_storage",
    "without_password",
]
