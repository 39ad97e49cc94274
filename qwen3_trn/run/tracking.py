"""Weights & Biases tracking, owned by the project.

torchtitan's ``WandBLogger`` reads project/group/job_type/tags only from environment variables
and passes ``WANDB_RUN_TAGS`` to ``wandb.init`` as one string (which wandb would split into
letters). This logger is plugged into ``RunMetricsProcessor`` instead, on the metrics rank only,
and sets everything explicitly:

- the run's *own* composed config (``<run dir>/config.yaml``) plus a ``run`` section with the
  mode (backend), kernel implementation, device, world layout, git revision and overrides;
- ``group``: the sweep's group in a multirun (shared by all its jobs), else ``logger.wandb.group``;
- ``job_type``: the mode; ``name``: from the job's (swept) overrides; ``tags``: a real list;
- a run id chosen before launch, so ``summary.json`` and the sweep manifest name the wandb run.

The parent process plans all of this (``plan_tracking``) and writes ``<run dir>/tracking.json``;
ranks never re-run Hydra, they read that file.
"""

from __future__ import annotations

import logging
import netrc
import os
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from qwen3_trn.config.overrides import override_values
from qwen3_trn.results.records import CONFIG_FILE, TRACKING_FILE, load_run_config, read_json, read_overrides, write_json_atomic

logger = logging.getLogger(__name__)


def git_revision(cwd: str | Path | None = None) -> str:
    """``git rev-parse HEAD`` of the project's checkout, or "unknown"."""
    cwd = cwd or Path(__file__).resolve().parent
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    revision = done.stdout.strip()
    return revision if done.returncode == 0 and revision else "unknown"


def new_run_id() -> str:
    """A wandb-style run id (8 lowercase letters/digits)."""
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
    return "".join(secrets.choice(alphabet) for _ in range(8))


def kernel_of(run_info: dict[str, Any], backend: str) -> str:
    """The kernel implementation a run used, as its backend reports it (``run_info["kernel"]``)."""
    return str(run_info.get("kernel") or f"{backend} default")


def plan_tracking(cfg, run_dir: Path, overrides: list[str], sweep: dict[str, Any] | None, run_info: dict[str, Any]) -> dict[str, Any]:
    """Everything the metrics rank needs to start the wandb run, decided once in the parent.

    ``cfg`` is the ``RunConfig``; ``sweep`` the job's place in a multirun (``qwen3_trn.sweeps.sweep``)
    or None for a single run.
    """
    wandb_cfg = cfg.logger.wandb
    backend = cfg.backend.name
    tags = [backend, str(run_info.get("device", cfg.device.type))]
    if sweep:
        tags.append("sweep")
        if sweep.get("experiment"):
            tags.append(str(sweep["experiment"]))
    tags += [str(t) for t in wandb_cfg.tags]
    tags = list(dict.fromkeys(t for t in tags if t))  # unique, in order
    name = wandb_cfg.name or cfg.run_name or (sweep or {}).get("name") or (",".join(overrides) if overrides else None)
    revision = git_revision()
    return {
        "enabled": "wandb" in cfg.logger.backends and wandb_cfg.mode != "disabled",
        "git_revision": revision,
        "overrides": list(overrides),
        "sweep": sweep,
        "wandb": {
            "project": wandb_cfg.project,
            "entity": wandb_cfg.entity,
            "mode": wandb_cfg.mode,
            "group": wandb_cfg.group or (sweep or {}).get("group"),
            "job_type": wandb_cfg.job_type or backend,
            "name": name[:128] if name else None,
            "tags": tags,
            "id": new_run_id(),
            "dir": str(Path(wandb_cfg.dir) if wandb_cfg.dir else run_dir),
        },
        "run": {
            "mode": backend,
            "kernel": kernel_of(run_info, backend),
            "device": run_info.get("device", cfg.device.type),
            "world_size": run_info.get("world_size"),
            "layout": run_info.get("layout"),
            "git_revision": revision,
            "overrides": list(overrides),
            "params": override_values(overrides),
            **({"sweep_group": sweep.get("group"), "sweep_dir": sweep.get("dir"), "job_num": sweep.get("num")} if sweep else {}),
        },
    }


def write_tracking(run_dir: Path, plan: dict[str, Any]) -> None:
    write_json_atomic(Path(run_dir) / TRACKING_FILE, plan)


def read_tracking(run_dir: Path) -> dict[str, Any] | None:
    return read_json(Path(run_dir) / TRACKING_FILE)


def summary_fields(plan: dict[str, Any]) -> dict[str, Any]:
    """What summary.json records about tracking (before the run starts)."""
    fields: dict[str, Any] = {"git_revision": plan["git_revision"]}
    if plan["enabled"]:
        w = plan["wandb"]
        fields["wandb"] = {k: w[k] for k in ("id", "mode", "project", "entity", "group", "job_type", "name", "tags", "dir")}
        fields["wandb_run_id"] = w["id"]
    return fields


def wandb_config(run_dir: Path, plan: dict[str, Any], run_info: dict[str, Any]) -> dict[str, Any]:
    """The config wandb records: the project's composed config plus the ``run`` section."""
    config_file = Path(run_dir) / CONFIG_FILE
    config: dict[str, Any] = {}
    if config_file.is_file():
        config = OmegaConf.to_container(OmegaConf.load(config_file), resolve=False)  # already resolved on disk
    config["run"] = {**{k: v for k, v in run_info.items() if k not in ("run_dir",)}, **plan["run"]}
    return config


def wandb_api_key() -> str | None:
    """The API key wandb would use: WANDB_API_KEY, else the one `wandb login` stored in ~/.netrc."""
    if os.environ.get("WANDB_API_KEY"):
        return os.environ["WANDB_API_KEY"]
    try:
        host = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai").split("://")[-1].split("/")[0]
        auth = netrc.netrc().authenticators(host)
        return auth[2] if auth else None
    except Exception:  # noqa: BLE001 - no or unreadable netrc: no key
        return None


class WandbRunLogger:
    """A torchtitan ``BaseLogger`` (duck-typed) for one wandb run, on the metrics rank."""

    def __init__(self, run_dir: Path, plan: dict[str, Any], run_info: dict[str, Any]) -> None:
        import wandb

        w = plan["wandb"]
        Path(w["dir"]).mkdir(parents=True, exist_ok=True)
        mode = w["mode"]
        if mode == "online" and not wandb_api_key():
            # Never block a training run on wandb's interactive login prompt.
            print(
                "wandb: logger.wandb.mode=online but no API key (WANDB_API_KEY or `wandb login`); "
                "logging offline instead (upload later with `wandb sync`).",
                flush=True,
            )
            mode = "offline"
        self.wandb = wandb
        self.run = wandb.init(
            project=w["project"],
            entity=w["entity"],
            mode=mode,
            dir=w["dir"],
            id=w["id"],
            name=w["name"],
            group=w["group"],
            job_type=w["job_type"],
            tags=list(w["tags"]),
            config=wandb_config(run_dir, plan, run_info),
            reinit="finish_previous",
            # The run directory keeps the full logs (logs/rank*.log); wandb gets metrics only.
            settings=wandb.Settings(console="off", quiet=True),
        )
        self.mode = mode
        self.run_dir = Path(self.run.dir).parent if self.run.dir else None
        where = getattr(self.run, "url", None) if self.mode == "online" else self.run_dir
        print(f"wandb: {self.mode} run {self.run.id} ({where})", flush=True)
        logger.info(f"wandb run {self.run.id} ({self.mode}) in {self.run_dir}")

    def info(self) -> dict[str, Any]:
        info = {"id": self.run.id, "mode": self.mode, "run_dir": str(self.run_dir) if self.run_dir else None}
        if self.mode == "online":
            info["url"] = self.run.url
        return info

    def log(self, metrics: dict[str, Any], step: int, record: dict[str, Any] | None = None) -> None:
        if record is None:  # e.g. validation metrics: torchtitan's names as they come
            payload = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}
        else:
            payload = {k: v for k, v in record.items() if k not in ("step", "time")}
            lrs = [k for k in payload if k.startswith("lr")]
            if lrs and "lr" not in payload:
                payload["lr"] = payload[lrs[0]]
        self.run.log(payload, step=step)

    def record_what_ran(self, facts: dict[str, Any]) -> None:
        """The metrics rank's facts (device, dtypes, kernel), next to the planned ``run`` section."""
        self.run.config.update({"ran": facts}, allow_val_change=True)

    def set_summary(self, summary: dict[str, Any]) -> None:
        self.run.summary.update({k: v for k, v in summary.items() if isinstance(v, (int, float, str))})

    def close(self) -> None:
        self.run.finish()
        if self.mode == "offline":
            print(f"wandb: offline run {self.run.id} saved; upload it with: wandb sync {self.run_dir}", flush=True)


def start_wandb(run_dir: Path, run_info: dict[str, Any]) -> WandbRunLogger | None:
    """The wandb logger for this run, or None (with one clear line) when it cannot start."""
    try:
        plan = read_tracking(run_dir) or _plan_from_run_dir(run_dir, run_info)
    except Exception as exc:  # noqa: BLE001 - tracking must never stop training
        logger.error(f"wandb: could not read the run's tracking plan ({type(exc).__name__}: {exc}); logging to metrics.jsonl only.")
        return None
    if not plan.get("enabled"):
        return None
    try:
        return WandbRunLogger(run_dir, plan, run_info)
    except ImportError:
        logger.error("logger.backends has wandb but the wandb package is not installed (pip install wandb); logging to metrics.jsonl only.")
    except Exception as exc:  # e.g. online without an API key: training goes on, metrics.jsonl keeps the record
        logger.error(f"wandb could not start a run ({type(exc).__name__}: {exc}); logging to metrics.jsonl only.")
    return None


def _plan_from_run_dir(run_dir: Path, run_info: dict[str, Any]) -> dict[str, Any]:
    """A run started without ``python -m qwen3_trn`` (the torchrun line of ``mode=plan`` on a
    saved config.yaml): plan its tracking here, on the metrics rank, from its own files."""
    plan = plan_tracking(load_run_config(run_dir), Path(run_dir), read_overrides(run_dir), None, run_info)
    write_tracking(Path(run_dir), plan)
    return plan


def finish_dangling_run(exit_code: int = 1) -> None:
    """Mark a wandb run that a failed job left open as failed (a sweep runs jobs in one process)."""
    wandb = sys.modules.get("wandb")
    if wandb is not None and getattr(wandb, "run", None) is not None:
        try:
            wandb.finish(exit_code=exit_code)
        except Exception:  # noqa: BLE001 - best effort cleanup
            pass
