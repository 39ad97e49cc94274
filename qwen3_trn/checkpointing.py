"""Checkpoints safe to resume from, and saves that fail with a clear error (docs/reliability.md).

A ``step-N`` is complete when it has DCP's ``.metadata`` (written last, after every shard) or,
for a model-only HF export, ``model.safetensors.index.json``: torchtitan's own rule. A failed
save's incomplete folder is removed to free the space the run's records need.
"""

from __future__ import annotations

import errno
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException

from qwen3_trn.common.errors import ConfigError
from qwen3_trn.titan import CheckpointManager, checkpoint_save, replaces_checkpoint_save

METADATA_FILE = ".metadata"
HF_INDEX_FILE = "model.safetensors.index.json"


@dataclass(frozen=True)
class StepFolder:
    step: int
    path: Path

    @property
    def complete(self) -> bool:
        return (self.path / METADATA_FILE).is_file() or (self.path / HF_INDEX_FILE).is_file()

    @property
    def why_incomplete(self) -> str:
        return f"no {METADATA_FILE}: its save did not finish (the run was killed or failed while writing it)"


def step_folders(folder: Path) -> list[StepFolder]:
    """The ``step-N`` folders directly in ``folder``, by step."""
    folder = Path(folder)
    found = []
    for child in folder.iterdir() if folder.is_dir() else []:
        match = re.fullmatch(r"step-(\d+)", child.name)
        if match and child.is_dir():
            found.append(StepFolder(int(match.group(1)), child))
    return sorted(found, key=lambda s: s.step)


@dataclass(frozen=True)
class ResumePoint:
    """The checkpoint a run resumes from, and the newer ``step-N`` folders passed over."""

    path: Path
    skipped: list[tuple[Path, str]] = field(default_factory=list)

    def notes(self) -> list[str]:
        lines = [f"resuming from {self.path}"]
        lines += [f"skipped {path}: {why}" for path, why in self.skipped]
        return lines


def find_resume_point(given: Path, folder_name: str, key: str = "checkpoint.resume_from") -> ResumePoint:
    """The newest complete checkpoint of a run directory (or its checkpoint folder), or the
    given ``step-N`` folder when that is complete; ConfigError otherwise."""
    given = Path(given)
    if re.fullmatch(r"step-\d+", given.name) and given.is_dir():
        chosen = StepFolder(int(given.name.split("-")[1]), given)
        if not chosen.complete:
            raise ConfigError(
                key,
                f"'{given}' is incomplete ({chosen.why_incomplete}); pass its run directory to resume from "
                "the newest complete checkpoint, or an older step-N folder.",
            )
        return ResumePoint(given)
    looked = []
    for folder in (given / folder_name, given):
        steps = step_folders(folder)
        looked.append(str(folder))
        if not steps:
            continue
        skipped = []
        for candidate in reversed(steps):
            if candidate.complete:
                return ResumePoint(candidate.path, skipped)
            skipped.append((candidate.path, candidate.why_incomplete))
        raise ConfigError(
            key,
            f"'{given}' has no complete checkpoint: "
            + "; ".join(f"{p.name} has {why}" for p, why in reversed(skipped))
            + ". Resume from a run that saved one, or start afresh.",
        )
    raise ConfigError(
        key,
        f"'{given}' holds no step-N checkpoint (looked in {' and '.join(looked)}); "
        "pass a run directory that was trained with checkpoint=on, or one of its step-N folders.",
    )


class CheckpointSaveError(RuntimeError):
    """A checkpoint save failed; the message says why and what is still loadable."""


def _root_causes(exc: BaseException) -> list[BaseException]:
    """The exceptions behind ``exc``: DCP's per-rank failures, and the cause chain."""
    found: list[BaseException] = []
    pending = [exc]
    while pending:
        current = pending.pop()
        if current is None or current in found:
            continue
        found.append(current)
        if isinstance(current, CheckpointException):
            pending += [failure[0] if isinstance(failure, tuple) else failure for failure in current.failures.values()]
        pending += [current.__cause__, current.__context__]
    return found


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def _reason(exc: BaseException, folder: Path, previous: StepFolder | None) -> str:
    causes = _root_causes(exc)
    innermost = causes[-1]
    detail = f"{type(innermost).__name__}: {str(innermost).strip().splitlines()[-1] if str(innermost).strip() else ''}"
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        free = None
    needed = _size(previous.path) if previous else 0
    # torch's writer reports a short write as "unexpected pos", not always as ENOSPC: a disk
    # left without room for another checkpoint is the cause either way.
    full = any(isinstance(c, OSError) and c.errno == errno.ENOSPC for c in causes) or (free is not None and free < max(needed, 2**20))
    if full:
        space = (
            f" ({free / 2**20:.1f} MiB free there" + (f", a checkpoint needs {needed / 2**20:.0f} MiB)" if needed else ")")
            if free is not None
            else ""
        )
        return f"no space left on device writing to {folder}{space}"
    oserror = next((c for c in causes if isinstance(c, OSError)), None)
    if oserror is not None:
        return f"{oserror.strerror or oserror} ({oserror.filename or folder})"
    return detail


def save_failure_message(exc: BaseException, step: int, folder: Path) -> str:
    previous = [s for s in step_folders(folder) if s.step != step and s.complete]
    kept = (
        f"the previous checkpoint {previous[-1].path} is complete and loadable (checkpoint.resume_from=<this run dir>)"
        if previous
        else "no earlier complete checkpoint exists"
    )
    return (
        f"checkpoint save at step {step} failed: {_reason(exc, folder, previous[-1] if previous else None)}. "
        f"The incomplete step-{step} was removed; {kept}. Free space or point checkpoint.folder at a larger disk, then resume."
    )


@replaces_checkpoint_save
class GuardedCheckpointManager(CheckpointManager):
    """torchtitan's CheckpointManager whose failed save raises ``CheckpointSaveError``."""

    @dataclass(kw_only=True, slots=True)
    class Config(CheckpointManager.Config):
        pass

    def _save(self, curr_step: int, last_step: bool = False) -> bool:
        try:
            return checkpoint_save(self, curr_step, last_step)
        except (Exception, CheckpointException) as exc:
            folder = Path(self.folder)
            message = save_failure_message(exc, curr_step, folder)
            incomplete = StepFolder(curr_step, folder / f"step-{curr_step}")
            if (not dist.is_initialized() or dist.get_rank() == 0) and incomplete.path.is_dir() and not incomplete.complete:
                shutil.rmtree(incomplete.path, ignore_errors=True)
            # DCP wraps a Ctrl-C that lands inside the save in its CheckpointException: the run
            # was interrupted, not failed, and the interrupt goes on as one.
            if any(isinstance(cause, KeyboardInterrupt) for cause in _root_causes(exc)):
                raise KeyboardInterrupt from exc
            raise CheckpointSaveError(message) from exc
