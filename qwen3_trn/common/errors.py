"""The error users see for bad input (the key and the fix), and ``Problems`` to report every
finding of a command at once.
"""

from __future__ import annotations

import signal
from contextlib import contextmanager
from typing import Iterator


def first_line(exc: BaseException) -> str:
    """An exception's first non-blank line without its closing full stop (its type's name if
    empty), for quoting a library's error inside ours."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0].rstrip(".") if lines else type(exc).__name__


class ConfigError(ValueError):
    """Invalid configuration, raised before any worker starts. ``key`` is the dotted key at fault;
    the message says how to fix it."""

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        super().__init__(f"{key}: {message}")


class NotApplicable(ConfigError):
    """A setting that does not apply to the chosen mode or model (``model.top_k`` on a dense
    flavor). A sweep records the job as skipped instead of failed."""


class ConfigErrors(ConfigError):
    """Several problems of one command, one paragraph each, in the order found."""

    def __init__(self, errors: list[ConfigError]) -> None:
        self.errors = errors
        self.key = errors[0].key
        paragraphs = "\n\n".join(f"  {error}" for error in errors)
        ValueError.__init__(self, f"{len(errors)} problems with this command:\n\n{paragraphs}")


class NotApplicableErrors(ConfigErrors, NotApplicable):
    """Several settings that do not apply to the chosen mode or model, and nothing else."""


def grouped(errors: list[ConfigError]) -> ConfigError:
    """One error for ``errors``: the error itself when there is only one."""
    if len(errors) == 1:
        return errors[0]
    if all(isinstance(error, NotApplicable) for error in errors):
        return NotApplicableErrors(errors)
    return ConfigErrors(errors)


class Problems:
    """Findings of a command's independent checks. Each check runs under ``check()``, which keeps
    its ``ConfigError`` and goes on; ``stop_if_any()`` raises them together where later checks need
    what failed."""

    def __init__(self) -> None:
        self.found: list[ConfigError] = []
        # Keys whose problem is known (a path that does not exist): what later checks find about
        # them (not a directory, no checkpoint there) would only say it again.
        self.settled: set[str] = set()

    @contextmanager
    def check(self) -> Iterator[None]:
        try:
            yield
        except ConfigError as exc:
            for error in exc.errors if isinstance(exc, ConfigErrors) else [exc]:
                if error.key not in self.settled and str(error) not in (str(seen) for seen in self.found):
                    self.found.append(error)

    def stop_if_any(self) -> None:
        if self.found:
            raise grouped(self.found)


def describe_error(exc: BaseException) -> str:
    """One line; for a multi-rank job, the first failing rank's own error, not torch elastic's
    banner."""
    if hasattr(exc, "get_first_failure"):
        try:
            rank, failure = exc.get_first_failure()
            message = failure.message.get("message", "") if isinstance(failure.message, dict) else str(failure.message or "")
            if message:
                return f"rank {rank} failed: {message.strip().splitlines()[0]}"[:500]
            if isinstance(failure.exitcode, int) and failure.exitcode < 0:
                try:
                    name = signal.Signals(-failure.exitcode).name
                except ValueError:
                    name = f"signal {-failure.exitcode}"
                return f"rank {rank} was killed by {name} (exit code {failure.exitcode})"
            return f"rank {rank} failed with exit code {failure.exitcode} (see its log)"
        except Exception:  # noqa: BLE001 - fall back to the exception's own text
            pass
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return (f"{type(exc).__name__}: {lines[0].strip()}" if lines else type(exc).__name__)[:500]


class RunInterrupted(KeyboardInterrupt):
    """A run stopped by a signal: summary *interrupted*, exit status 130."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by signal {signum}")
        self.signum = signum
