"""A launcher: how the ranks of a run are started, behind one interface.

Each ``launcher=<option>`` is a ``Launcher`` subclass with a ``Config`` (in
``qwen3_trn.config.option_schemas``, registered in ``LauncherConfig.options`` by its ``name``),
as backends are. The app, the
plan and the sweep talk to this interface only:

- ``ranks_here``: whether the ranks run on this machine (else the device is planned for);
- ``validate``: the launcher's own checks, before anything is written (``ConfigError``);
- ``describe``: what ``mode=plan`` shows of where and how the ranks would start;
- ``launch``: start the ranks of a prepared run; returns the run's status;
- ``waits_for_jobs``: whether ``launch`` returns only once the run ended (its outcome in the
  records), unless detached; a search asks it rather than reading a launcher's key;
- ``refresh``: the current state of runs it started elsewhere (a Slurm job), into their records;
- ``stop``: end runs it started elsewhere (a search's Ctrl-C); a run here stops with its process;
- ``record_job``: the one writer of such a run's launcher-neutral ``job`` section
  (``records.JOB_SECTION``), which the sweep, ``qwen3_trn.status`` and the app read without
  knowing which launcher wrote it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from qwen3_trn.config.options import Configurable
from qwen3_trn.config.schema import LauncherConfig, RunConfig
from qwen3_trn.results.records import JOB_SECTION, RunStatus, update_summary
from qwen3_trn.run.layout import Layout
from qwen3_trn.run.preflight import Prepared
from qwen3_trn.titan import Trainer


@dataclass
class LaunchDescription:
    """A launcher's part of ``mode=plan``."""

    where: str
    # The torchrun line that starts (a node's) ranks the same way, outside this framework.
    torchrun: str
    # What the launcher submits or runs (the torchrun line, or a Slurm job's sbatch script).
    submission: str
    # Extra plan sections (title -> text), e.g. the sbatch script of a Slurm job.
    sections: dict[str, str] = field(default_factory=dict)


class Launcher(Configurable):
    Config: ClassVar[type[LauncherConfig]] = LauncherConfig
    # The ``launcher=<name>`` of this class (its Config's).
    name: ClassVar[str]
    ranks_here: ClassVar[bool] = True
    config: LauncherConfig

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.name = cls.Config.name

    def validate(self, cfg: RunConfig, layout: Layout) -> None:
        """Checks of this launcher's keys (every mode) and, in ``mode=train``, of what it
        needs to start the ranks; raise ``ConfigError``."""

    def describe(self, prepared: Prepared, run_dir: Path) -> LaunchDescription:
        raise NotImplementedError

    def launch(self, prepared: Prepared, trainer_config: Trainer.Config | None = None, *, detach: bool = False) -> RunStatus:
        """Start the ranks (reusing ``trainer_config``, preflight's, where a rank runs in this
        process). ``detach``: return once they are submitted elsewhere, without waiting (a
        sweep waits for all its jobs at its end)."""
        raise NotImplementedError

    @property
    def waits_for_jobs(self) -> bool:
        """``launch`` returns once the run ended (unless ``detach``): its outcome is in the records."""
        return True

    @classmethod
    def record_job(cls, run_dir: Path, job: dict[str, Any], /, **fields: Any) -> dict[str, Any]:
        """The job this launcher started elsewhere, into the run's ``summary.json``: ``job``
        merged key by key into its ``job`` section (with the launcher's name), ``fields``
        (status, error ...) beside it. Returns the summary.

        The section's fields that readers use, whatever the launcher: ``id``, ``state`` (the
        launcher's own word for it), ``label`` (``Slurm job 12``), ``stdout`` and ``stderr``
        (the job's main log and error log), ``logs`` (every log file), ``node_errors`` ({host:
        {node, error, time}} of a multi-node job). A launcher adds its own facts beside them."""
        return update_summary(run_dir, **fields, **{JOB_SECTION: {"launcher": cls.name, **job}})

    @classmethod
    def refresh(cls, run_dirs: list[Path], wait: bool = False) -> list[dict[str, Any]]:
        """Bring the summaries of runs this launcher started elsewhere up to date; returns them.
        Local runs have nothing to refresh."""
        return []

    @classmethod
    def stop(cls, run_dirs: list[Path]) -> None:
        """End the runs this launcher started elsewhere that are still in flight (their records
        then follow through ``refresh``). Runs on this machine end with the process that runs
        them: nothing to do here."""
