"""Secret-looking environment values (names with TOKEN, KEY, SECRET, ...) never reach a file.

They still reach ranks and jobs through the environment. In what the project writes they are
redacted by key (``launcher.env`` entries, config leaves, overrides) and, as a last guard in
every writer and rank log, by value (known values of 8 characters or more that are not an
existing path); a password in a URL (a search's study storage) reads ``<redacted>``
wherever the URL is a config leaf or an override. User-facing behaviour: docs/reliability.md.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import shlex
import sys
from typing import Any, Iterable, Mapping

from hydra.core.override_parser.overrides_parser import OverridesParser

REDACTED = "<redacted>"
SECRET_NAME = re.compile(r"TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIAL|PRIVATE", re.IGNORECASE)
# Shorter values are left alone by the value scrub (they would match ordinary text); the
# structural redaction covers them.
MIN_SCRUBBED_LENGTH = 8
# scheme://user:password@ -> the password
URL_PASSWORD = re.compile(r"(?P<head>\b[A-Za-z][\w+.-]*://[^\s/:@]*:)(?P<password>[^\s@/]+)(?=@)")

_registered: set[str] = set()


def looks_secret(name: str) -> bool:
    return _secret_name(str(name))


@functools.lru_cache(maxsize=4096)
def _secret_name(name: str) -> bool:
    # Cached: every line of a rank's log looks through the environment's names (``scrub``).
    return bool(SECRET_NAME.search(name))


def is_redacted(value: Any) -> bool:
    return value == REDACTED


def passed_env(env: Mapping[str, Any]) -> dict[str, str]:
    """A saved ``launcher.env`` without its redacted entries: those come from the environment."""
    return {str(key): str(value) for key, value in env.items() if not is_redacted(value)}


def redact_url(text: str) -> str:
    """``mysql+pymysql://user:pw@host/db`` -> ``mysql+pymysql://user:<redacted>@host/db``."""
    return URL_PASSWORD.sub(lambda m: m["head"] + REDACTED, text)


def url_password(text: str) -> str | None:
    """The password of the first URL in ``text`` that has one."""
    match = URL_PASSWORD.search(str(text))
    return match["password"] if match else None


def redact_tree(node: Any) -> Any:
    """A plain config tree (dicts and lists) with every leaf under a secret-looking key, and every
    URL's password, redacted."""
    if isinstance(node, str):
        return redact_url(node)
    if isinstance(node, dict):
        return {
            k: (REDACTED if looks_secret(k) and not isinstance(v, (dict, list)) and v is not None else redact_tree(v))
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [redact_tree(v) for v in node]
    return node


def redact_dump(node: Any) -> Any:
    """A dumped config or override list with secret keys and their ``key=value`` strings redacted."""
    node = redact_tree(node)
    if isinstance(node, dict):
        return {k: redact_dump(v) for k, v in node.items()}
    if isinstance(node, list):
        return [redact_dump(v) for v in node]
    return redact_override(node) if isinstance(node, str) else node


def redact_override(override: str) -> str:
    """``+launcher.env.HF_TOKEN=hf_x`` -> ``+launcher.env.HF_TOKEN=<redacted>``, and
    ``+launcher.env={HF_TOKEN: hf_x, A: b}`` -> ``+launcher.env={HF_TOKEN: '<redacted>', A: b}``."""
    override = redact_url(str(override))
    key, sep, value = override.partition("=")
    if not sep:
        return override
    if looks_secret(key.lstrip("+~").rsplit(".", 1)[-1]):
        return f"{key}={REDACTED}"
    if "{" in value:  # a dict value may hold secret keys
        try:
            parsed = OverridesParser.create().parse_override(override).value()
        except Exception:  # noqa: BLE001 - not an override Hydra can read: no structure to redact
            return override
        redacted = redact_tree(parsed)
        if redacted != parsed:
            return f"{key}={_override_value(redacted)}"
    return override


def _override_value(node: Any) -> str:
    """A plain value in Hydra's override syntax (strings quoted)."""
    if isinstance(node, dict):
        return "{" + ", ".join(f"{k}: {_override_value(v)}" for k, v in node.items()) + "}"
    if isinstance(node, list):
        return "[" + ", ".join(_override_value(v) for v in node) + "]"
    if isinstance(node, str):
        return "'" + node.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return "null" if node is None else json.dumps(node)


def redact_overrides(overrides: Iterable[str]) -> list[str]:
    return [redact_override(o) for o in overrides]


def redact_argv() -> None:
    """Redact secret overrides in ``sys.argv`` once parsed, before libraries record it (wandb's
    run metadata)."""
    sys.argv[1:] = redact_overrides(sys.argv[1:])


def remember(values: Iterable[Any]) -> None:
    """Values to scrub besides the environment's (this run's ``launcher.env``)."""
    _registered.update(str(v) for v in values if v is not None and not is_redacted(v))


def remember_env(env: Mapping[str, Any]) -> None:
    remember(value for key, value in env.items() if looks_secret(key))


def _scrubbable(value: str) -> bool:
    return len(value) >= MIN_SCRUBBED_LENGTH and not os.path.exists(value)


def secret_values() -> list[str]:
    """Every known secret value, longest first."""
    values = {v for k, v in os.environ.items() if looks_secret(k)} | _registered
    return sorted((v for v in values if _scrubbable(v)), key=len, reverse=True)


def _forms(value: str) -> set[str]:
    """The value as it appears in text, JSON strings and shell words."""
    return {value, json.dumps(value)[1:-1], shlex.quote(value)}


def scrub(text: str) -> str:
    """``text`` with every known secret value replaced by ``<redacted>``."""
    for value in secret_values():
        for form in _forms(value):
            if form and form in text:
                text = text.replace(form, REDACTED)
    return text


class RedactingFormatter(logging.Formatter):
    """A log formatter whose lines never carry a secret value."""

    def format(self, record: logging.LogRecord) -> str:
        return scrub(super().format(record))


class RedactingFilter(logging.Filter):
    """Scrubs other libraries' log messages (Hydra's launch lines list every override)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = scrub(record.getMessage()), ()
        return True


def redact_log_handlers(logger: logging.Logger | None = None) -> None:
    for handler in (logger or logging.getLogger()).handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())
