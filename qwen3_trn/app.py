"""One job, from a composed Hydra config to a finished run directory.

``execute`` composes nothing itself: it types the config, builds the launcher, prepares the
run (every check before anything is written), claims the run directory, and then either
plans (``mode=plan``/``check``) or launches and records the outcome in ``summary.json``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.table import Table

from qwen3_trn.config.schema import Mode
from qwen3_trn.config.typed import to_run_config
from qwen3_trn.errors import ConfigError
from qwen3_trn.fit import tracked_section
from qwen3_trn.launch import build_launcher
from qwen3_trn.plan import config_differences, plan_record, render_plan
from qwen3_trn.preflight import prepare
from qwen3_trn.records import (
    CONFIG_FILE,
    LAUNCH_TIME_ENV,
    PLAN_FILE,
    PLAN_TEXT_FILE,
    TRACEBACK_ENV,
    RunStatus,
    claim_run_dir,
    update_summary,
    write_json_atomic,
    write_run_files,
    write_text_atomic,
)
from qwen3_trn.sweep import in_multirun, job_context, run_sweep_job
from qwen3_trn.tracking import plan_tracking, summary_fields, write_tracking

__all__ = ["execute", "run", "to_run_config"]


def _overrides() -> list[str]:
    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []


def _print_summary(summary: dict) -> None:
    console = Console()
    if summary.get("status") == RunStatus.submitted:
        slurm = summary.get("slurm") or {}
        console.print(f"qwen3_trn: submitted Slurm job {slurm.get('job_id')}; outputs: {summary.get('run_dir')}", soft_wrap=True)
        return
    if not summary.get("steps_logged"):
        # Multi-node: metrics are written by the node that hosted global rank 0.
        console.print(
            f"qwen3_trn: this node's ranks {summary.get('status')}; no metrics rank ran here. outputs: {summary.get('run_dir')}",
            soft_wrap=True,
        )
        return

    table = Table(title=f"qwen3_trn run {summary.get('status', '')}", show_header=False)
    rows = [
        (
            "backend / device",
            f"{summary.get('backend')} / {summary.get('device')}" + (f" / kernel {summary['kernel']}" if "kernel" in summary else ""),
        ),
        ("steps", f"{summary.get('first_step')} -> {summary.get('last_step')}"),
        ("loss first -> last", f"{summary.get('first_loss', float('nan')):.4f} -> {summary.get('last_loss', float('nan')):.4f}"),
        *(
            [("val loss (perplexity)", f"{summary['val_loss']:.4f} ({summary['val_perplexity']:,.1f}) at step {summary['val_step']}")]
            if "val_loss" in summary
            else []
        ),
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
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise ConfigError(
            "parallelism", f"torchtitan could not build rank 0 of this layout on its fake backend:\n{done.stderr.strip()[-2000:]}"
        )
    return json.loads(done.stdout.strip().splitlines()[-1])


def execute(cfg_node: DictConfig) -> dict | None:
    cfg = to_run_config(cfg_node)
    launcher = build_launcher(cfg.launcher)
    prepared = prepare(cfg, ranks_here=launcher.ranks_here)
    launcher.validate(cfg, prepared.layout)
    if prepared.layout_choice:  # parallelism=auto: the saved config starts every rank with the chosen degrees
        cfg_node.parallelism = OmegaConf.structured(cfg.parallelism)
    run_dir = claim_run_dir(cfg.output_dir)
    write_run_files(run_dir, cfg_node, _overrides(), prepared.trainer_config.to_dict())
    sweep = job_context()
    if cfg.mode != Mode.train:
        launch = launcher.describe(prepared, run_dir)
        differences = config_differences(cfg_node, sweep["swept_keys"] if sweep else None)
        text = render_plan(prepared, launch, cfg_node, differences)
        if cfg.mode == Mode.check:
            check = _check_in_subprocess(run_dir)
            text += f"\n== Fake-backend check ==\n{json.dumps(check)}\n"
            text += f"\n== Memory of rank 0 measured by the tracker ==\n{tracked_section(prepared.fit, check)}\n"
        write_text_atomic(run_dir / PLAN_TEXT_FILE, text)
        print(text, end="")
        record = plan_record(prepared, launch, run_dir, differences[2])
        write_json_atomic(run_dir / PLAN_FILE, record)
        return {"status": RunStatus.planned, "run_dir": str(run_dir), "plan": record}

    info = prepared.trainer_config.metrics.run_info
    tracking = plan_tracking(cfg, run_dir, _overrides(), sweep, info)
    write_tracking(run_dir, tracking)
    update_summary(run_dir, **info, **summary_fields(tracking), status=RunStatus.running)
    if sweep is not None:  # jobs of a sweep run one after another in this process
        os.environ[LAUNCH_TIME_ENV] = str(time.time())
    else:
        os.environ.setdefault(LAUNCH_TIME_ENV, str(time.time()))
    started = time.perf_counter()
    status = RunStatus.failed
    try:
        status = launcher.launch(prepared, prepared.trainer_config, detach=sweep is not None)
    except BaseException as exc:
        status = getattr(exc, "run_status", RunStatus.failed)  # e.g. cancelled: a waited-for Slurm job
        raise
    finally:
        fields = {} if status == RunStatus.submitted else {"wall_time_s": time.perf_counter() - started}
        summary = update_summary(run_dir, status=status, **fields)
    _print_summary(summary)
    return summary


def run(cfg_node: DictConfig) -> dict | None:
    """Hydra's task function: a ConfigError becomes one clear paragraph and exit status 2.

    In a multirun (``-m``) a job's error is recorded in its job.json and the sweep manifest
    instead, and the sweep goes on (``qwen3_trn.sweep``)."""
    if in_multirun():
        return run_sweep_job(execute, cfg_node)
    try:
        return execute(cfg_node)
    except ConfigError as exc:
        _discard_if_empty(Path(cfg_node.output_dir))
        if os.environ.get(TRACEBACK_ENV) or os.environ.get("HYDRA_FULL_ERROR"):
            raise
        print(f"error: {exc}\n(set {TRACEBACK_ENV}=1 for a traceback)", file=sys.stderr)
        sys.exit(2)


def _discard_if_empty(run_dir: Path) -> None:
    """Hydra creates the run directory before the job runs; a refused job leaves none behind."""
    try:
        run_dir.rmdir()  # only while it is empty
    except OSError:
        pass
