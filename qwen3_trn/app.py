"""One job, from a composed Hydra config to a finished run directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from qwen3_trn.config.schema import RunConfig
from qwen3_trn.errors import ConfigError
from qwen3_trn.outputs import CONFIG_FILE, claim_run_dir, write_run_files

SHOW_TRACEBACK_ENV = "QWEN3_TRN_TRACEBACK"


def to_run_config(cfg: DictConfig) -> RunConfig:
    """The typed config. Re-merging onto the schema rejects keys added with ``+`` that the
    schema does not have (Hydra lets ``+key=`` through a structured config)."""
    from omegaconf.errors import ConfigKeyError, ValidationError

    container = OmegaConf.to_container(cfg, resolve=True)
    try:
        merged = OmegaConf.merge(OmegaConf.structured(RunConfig), container)
    except (ConfigKeyError, ValidationError) as exc:
        key = getattr(exc, "full_key", None) or "config"
        raise ConfigError(key, f"{str(exc).splitlines()[0]}. Remove it or check the spelling (python -m qwen3_trn --cfg job lists every key); "
                          "torchtitan fields without a key here go under +titan.<path>=<value>.") from exc
    return OmegaConf.to_object(merged)


def _overrides() -> list[str]:
    from hydra.core.hydra_config import HydraConfig

    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []


def _print_summary(summary: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if summary.get("status") == "submitted":
        slurm = summary.get("slurm") or {}
        console.print(f"qwen3_trn: submitted Slurm job {slurm.get('job_id')}; outputs: {summary.get('run_dir')}", soft_wrap=True)
        return
    if not summary.get("steps_logged"):
        # Multi-node: metrics are written by the node that hosted global rank 0.
        console.print(f"qwen3_trn: this node's ranks {summary.get('status')}; no metrics rank ran here. outputs: {summary.get('run_dir')}", soft_wrap=True)
        return

    table = Table(title=f"qwen3_trn run {summary.get('status', '')}", show_header=False)
    rows = [
        ("backend / device", f"{summary.get('backend')} / {summary.get('device')}" + (f" / kernel {summary['kernel']}" if "kernel" in summary else "")),
        ("steps", f"{summary.get('first_step')} -> {summary.get('last_step')}"),
        ("loss first -> last", f"{summary.get('first_loss', float('nan')):.4f} -> {summary.get('last_loss', float('nan')):.4f}"),
        *([("val loss (perplexity)", f"{summary['val_loss']:.4f} ({summary['val_perplexity']:,.1f}) at step {summary['val_step']}")]
          if "val_loss" in summary else []),
        ("tokens/s", f"{summary.get('tokens_per_s', 0):,.0f}"),
        ("peak memory", f"{summary.get('peak_memory_gib', 0):.2f} GiB"),
        ("wall time", f"{summary.get('wall_time_s', 0):.1f} s"),
    ]
    if "mfu_pct" in summary:
        rows.insert(4, ("MFU", f"{summary['mfu_pct']:.2f} %"))
    for name, value in rows:
        table.add_row(name, value)
    console.print(table)
    console.print(f"outputs: {summary.get('run_dir')}", soft_wrap=True)
    if summary.get("hf_export"):
        console.print(f"Hugging Face model: {summary['hf_export']}", soft_wrap=True)


def _check_in_subprocess(run_dir: Path) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "qwen3_trn.rank", str(run_dir / CONFIG_FILE), "--check"],
        capture_output=True, text=True,
    )
    if done.returncode != 0:
        raise ConfigError("parallelism", f"torchtitan could not build rank 0 of this layout on its fake backend:\n{done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def execute(cfg_node: DictConfig) -> dict | None:
    from qwen3_trn.launch import LAUNCHERS
    from qwen3_trn.metrics import write_summary
    from qwen3_trn.plan import plan_record, render_plan
    from qwen3_trn.preflight import prepare
    from qwen3_trn.sweep import job_context
    from qwen3_trn.tracking import plan_tracking, summary_fields, write_tracking
    from qwen3_trn.worker import WorkerJob

    cfg = to_run_config(cfg_node)
    prepared = prepare(cfg)
    run_dir = claim_run_dir(cfg.output_dir)
    write_run_files(run_dir, cfg_node, _overrides(), prepared.trainer_config.to_dict())
    if cfg.mode != "train":
        text = render_plan(prepared, cfg_node, run_dir)
        if cfg.mode == "check":
            text += f"\n== Fake-backend check ==\n{json.dumps(_check_in_subprocess(run_dir))}\n"
        (run_dir / "plan.txt").write_text(text)
        print(text, end="")
        return {"status": "planned", "run_dir": str(run_dir), "plan": plan_record(prepared, run_dir)}

    info = prepared.trainer_config.metrics.run_info
    sweep = job_context()
    tracking = plan_tracking(cfg, run_dir, _overrides(), sweep, info)
    write_tracking(run_dir, tracking)
    write_summary(run_dir, [], {**info, **summary_fields(tracking)}, status="running")
    if sweep is not None:  # jobs of a sweep run one after another in this process
        os.environ["QWEN3_TRN_LAUNCH_TIME"] = str(time.time())
    else:
        os.environ.setdefault("QWEN3_TRN_LAUNCH_TIME", str(time.time()))
    started = time.perf_counter()
    status = "failed"
    try:
        outcome = LAUNCHERS[cfg.launcher.name](WorkerJob(cfg=cfg, device_type=prepared.device.type, layout=prepared.layout))
        # launcher=slurm returns "submitted" when it does not wait for its job
        status = outcome if isinstance(outcome, str) else "completed"
    except BaseException as exc:
        status = getattr(exc, "run_status", "failed")  # e.g. "cancelled": a waited-for Slurm job
        raise
    finally:
        summary = json.loads((run_dir / "summary.json").read_text())
        summary.update(status=status)
        if status != "submitted":
            summary.update(wall_time_s=time.perf_counter() - started)
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    _print_summary(summary)
    return summary


def run(cfg_node: DictConfig) -> dict | None:
    """Hydra's task function: a ConfigError becomes one clear paragraph and exit status 2.

    In a multirun (``-m``) a job's error is recorded in its job.json and the sweep manifest
    instead, and the sweep goes on (``qwen3_trn.sweep``)."""
    from qwen3_trn.sweep import in_multirun, run_sweep_job

    if in_multirun():
        return run_sweep_job(execute, cfg_node)
    try:
        return execute(cfg_node)
    except ConfigError as exc:
        if os.environ.get(SHOW_TRACEBACK_ENV) or os.environ.get("HYDRA_FULL_ERROR"):
            raise
        print(f"error: {exc}\n(set {SHOW_TRACEBACK_ENV}=1 for a traceback)", file=sys.stderr)
        sys.exit(2)
