"""Secrets for the tests that check none is written (helper module, not a test file): values
in the environment and in launcher.env, and how to look for them in files and processes."""

from __future__ import annotations

from pathlib import Path

SECRETS_IN_ENV = {
    "WANDB_API_KEY": "env-wandb-0f3a9c1d7e",
    "HF_TOKEN": "hf_envAbCdEfGh123456",
    "AWS_SECRET_ACCESS_KEY": "env/aws+Secret9876543",
    "QWEN3_TRN_SERVICE_TOKEN": "env-only-token-5521",
}
SECRETS_IN_LAUNCHER_ENV = {
    "WANDB_API_KEY": "cfg-wandb-8b2e4f6a0c",
    "HF_TOKEN": "hf_cfgZyXwVu987654",
    "AWS_SECRET_ACCESS_KEY": "cfg/aws+Secret1234567",
}


def secret_args() -> list[str]:
    return [f"+launcher.env.{key}={value}" for key, value in SECRETS_IN_LAUNCHER_ENV.items()]


def files_with_secrets(root: Path) -> list[str]:
    """Every file under ``root`` whose bytes hold one of the secret values."""
    values = [v.encode() for v in (*SECRETS_IN_ENV.values(), *SECRETS_IN_LAUNCHER_ENV.values())]
    hits = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            hits += [f"{path}: {v.decode()}" for v in values if v in data]
    return hits


def process_env(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def process_cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
