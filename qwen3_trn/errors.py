"""The one error type users see for bad input: a short message naming the key and the fix."""


class ConfigError(ValueError):
    """Raised for invalid configuration before any worker starts.

    ``key`` is the dotted config key at fault; the message says how to fix it.
    """

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        super().__init__(f"{key}: {message}")
