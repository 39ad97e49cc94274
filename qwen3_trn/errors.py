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
