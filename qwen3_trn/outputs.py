"""The run directory: what a run writes, and the rule that it never overwrites another run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from qwen3_trn.errors import ConfigError

CONFIG_FILE = "config.yaml"
OVERRIDES_FILE = "overrides.yaml"
TRAINER_CONFIG_FILE = "trainer_config.json"
RUN_MARKERS = (CONFIG_FILE, "metrics.jsonl", "summary.json", "checkpoint")


def claim_run_dir(path: str) -> Path:
    """The run directory, refused if an earlier run already wrote there."""
    run_dir = Path(path)
    taken = [name for name in RUN_MARKERS if (run_dir / name).exists()]
    if taken:
        raise ConfigError(
            "hydra.run.dir",
            f"'{run_dir}' already holds a run ({', '.join(taken)}); nothing was changed. Choose a new "
            "directory (leave hydra.run.dir unset for a fresh one), or resume it into a new run with "
            f"checkpoint.resume_from={run_dir}.",
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


def write_run_files(run_dir: Path, resolved: DictConfig, overrides: list[str], trainer_config_dict: dict[str, Any]) -> None:
    (run_dir / CONFIG_FILE).write_text(OmegaConf.to_yaml(resolved, resolve=True))
    (run_dir / OVERRIDES_FILE).write_text(OmegaConf.to_yaml(OmegaConf.create(list(overrides))))
    (run_dir / TRAINER_CONFIG_FILE).write_text(json.dumps(trainer_config_dict, indent=2, default=repr) + "\n")
