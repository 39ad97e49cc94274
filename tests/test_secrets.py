"""No secret reaches a file under a run directory, third-party records included (wandb's run
metadata with its copy of argv, its logs and its binary run file; torchtitan's rank logs), from
any of the three places a user gives one: the command line (a dict override too), the
environment, and a file in ``--config-dir``. The ranks still get them in their environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from qwen3_trn.results.records import read_summary
from tests.commands import command_in_subprocess
from tests.secret_values import SECRETS_IN_ENV

ON_COMMAND_LINE = {"AWS_SECRET_ACCESS_KEY": "cli/aws+Secret0246813579", "HF_TOKEN": "hf_cliDictAbCdEf13579"}
IN_CONFIG_FILE = {"WANDB_API_KEY": "file-wandb-5d4c3b2a19"}


def files_holding(root: Path, values: list[str]) -> list[str]:
    """Every file below ``root`` whose bytes (text or binary) hold one of ``values``."""
    hits = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            hits += [f"{path}: {v}" for v in values if v.encode() in data]
    return hits


@pytest.mark.slow
def test_no_secret_in_any_file_of_a_run(tmp_path, run_dir):
    config_dir = tmp_path / "conf"
    (config_dir / "launcher").mkdir(parents=True)
    (config_dir / "launcher" / "with_keys.yaml").write_text(
        "defaults:\n  - local\nenv:\n" + "".join(f"  {k}: {v}\n" for k, v in IN_CONFIG_FILE.items())
    )
    as_dict = "{" + ", ".join(f"{k}: '{v}'" for k, v in ON_COMMAND_LINE.items()) + "}"
    result = command_in_subprocess(
        [
            "--config-dir",
            str(config_dir),
            "launcher=with_keys",
            "debug=smoke",
            "training.steps=2",
            "logger=wandb",
            f"+launcher.env={as_dict}",
        ],
        run_dir,
        env=SECRETS_IN_ENV,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert read_summary(run_dir)["status"] == "completed"
    # wandb recorded the command line, with the dict override's secret keys redacted
    (wandb_file,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    assert b"+launcher.env={AWS_SECRET_ACCESS_KEY: '<redacted>', HF_TOKEN: '<redacted>'}" in wandb_file.read_bytes()
    secrets = [*ON_COMMAND_LINE.values(), *IN_CONFIG_FILE.values(), *SECRETS_IN_ENV.values()]
    assert files_holding(run_dir, secrets) == []
    assert not [v for v in secrets if v in result.stdout + result.stderr]
