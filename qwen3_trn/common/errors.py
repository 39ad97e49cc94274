"""The one error type users see for bad input: a short message naming the key and the fix.

A command's independent checks collect their findings in ``Problems``, so that it reports every
problem at once (``ConfigErrors``: one paragraph each) rather than the first one only.
"""

from __future__ import annotations

import signal
from contextlib import contextmanager
from typing import Iterator


def first_line(exc: BaseException) -> str:
    """The first non-blank line of an exception's message, without a closing full stop (its
    type's name when it has none): a library's error quoted inside one of ours."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0].rstrip(".") if lines else type(exc).__name__


class ConfigError(ValueError):
    """Raised for invalid configuration before any worker starts.

    ``key`` is the dotted config key at fault; the message says how to fix it.
    """

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        super().__init__(f"{key}: {message}")


class NotApplicable(ConfigError):
    """A setting that does not apply to the chosen mode or model, e.g. ``model.top_k`` with a
    dense flavor or ``model.hidden_dim`` with an MoE one.

    A single run fails on it like on any ``ConfigError``; a multirun sweep that mixes modes
    records the job as *skipped* (with this message) instead of failed, and goes on.
    """


class ConfigErrors(ConfigError):
    """Several problems of one command, reported together: one paragraph each, in the order
    the checks found them."""

    def __init__(self, errors: list[ConfigError]) -> None:
        self.errors = errors
        self.key = errors[0].key
        paragraphs = "\n\n".join(f"  {error}" for error in errors)
        ValueError.__init__(self, f"{len(errors)} problems with this command:\n\n{paragraphs}")


class NotApplicableErrors(ConfigErrors, NotApplicable):
    """Several settings that do not apply to the chosen mode or model, and nothing else."""


def grouped(errors: list[ConfigError]) -> ConfigError:
    """One error for ``errors``: the error itself when there is one."""
    if len(errors) == 1:
        return errors[0]
    if all(isinstance(error, NotApplicable) for error in errors):
        return NotApplicableErrors(errors)
    return ConfigErrors(errors)


class Problems:
    """The findings of a command's independent checks, gathered so that all are reported at once.

    Each check runs under ``check()``; a ``ConfigError`` it raises is kept and the next check
    runs. ``stop_if_any()`` raises them together where a later check would be meaningless
    without what failed (a layout cannot be sized for a model whose size is out of range).
    """

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
    """One line: for a multi-rank job, the first failing rank's own error (torch elastic's
    ``ChildFailedError``), not the launcher's banner."""
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
    """A run stopped by a signal (Ctrl-C, SIGTERM): its summary says *interrupted*, exit status 130."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by signal {signum}")
        self.signum = signum
