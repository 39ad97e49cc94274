"""The one error type users see for bad input: a short message naming the key and the fix."""


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


def describe_error(exc: BaseException) -> str:
    """One line: for a multi-rank job, the first failing rank's own error (torch elastic's
    ``ChildFailedError``), not the launcher's banner."""
    if hasattr(exc, "get_first_failure"):
        try:
            rank, failure = exc.get_first_failure()
            message = failure.message.get("message", "") if isinstance(failure.message, dict) else str(failure.message or "")
            if message:
                return f"rank {rank} failed: {message.strip().splitlines()[0]}"[:500]
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
