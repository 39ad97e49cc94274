"""One job: from a composed config to a finished run directory.

Types the config, builds the launcher, claims the run directory (given back when a check
fails), prepares the run, then plans or launches and records the outcome in ``summary.json``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import traceback
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.table import Table

from qwen3_trn.cli.early import in_multirun, no_run_dir_left, run_dir_pattern
from qwen3_trn.cli.exits import exit_status
from qwen3_trn.common.allocator import host_allocator_choice
from qwen3_trn.common.errors import ConfigError, RunInterrupted, describe_error
from qwen3_trn.common.redact import redact_argv, redact_overrides, remember_env
from qwen3_trn.config.schema import Mode, RunConfig
from qwen3_trn.config.typed import to_run_config
from qwen3_trn.launch import build_launcher
from qwen3_trn.plan import config_differences, plan_record, render_plan
from qwen3_trn.results.processes import this_process
from qwen3_trn.results.records import (
    CONFIG_FILE,
    ERROR_LOG,
    LAUNCH_TIME_ENV,
    METRICS_FILE,
    PLAN_FILE,
    PLAN_TEXT_FILE,
    RunStatus,
    claim_run_dir,
    job_label,
    job_section,
    read_metrics,
    release_run_dir,
    scrub_hydra_files,
    summarize,
    update_summary,
    write_json_atomic,
    write_run_files,
    write_text_atomic,
)
from qwen3_trn.run.convert import compile_warning
from qwen3_trn.run.fit import tracked_section
from qwen3_trn.run.preflight import prepare
from qwen3_trn.run.tracking import plan_tracking, summary_fields, write_tracking
from qwen3_trn.sweeps.sweep import job_context, run_sweep_job

__all__ = ["execute", "run", "to_run_config"]


def _overrides() -> list[str]:
    return redact_overrides(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []


def _print_summary(summary: dict) -> None:
    console = Console()
    if summary.get("status") == RunStatus.submitted:
        console.print(f"qwen3_trn: submitted {job_label(job_section(summary))}; outputs: {summary.get('run_dir')}", soft_wrap=True)
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


def execute(cfg_node: DictConfig, typed: RunConfig | None = None) -> dict | None:
    """``typed``: ``cfg_node`` already typed (``early.answer_early``), else it is typed here."""
    host_allocator_choice()  # an unknown QWEN3_TRN_HOST_ALLOCATOR is bad input, refused here
    # ranges: among preflight's checks, with the others
    cfg = typed if typed is not None else to_run_config(cfg_node, check_ranges=False)
    remember_env(cfg.launcher.env)
    launcher = build_launcher(cfg.launcher)
    requested = cfg.output_dir
    # A timestamped directory (the default) is shared by runs started in the same instant: the
    # later one takes a fresh sibling. A directory given as such is refused when it holds a run.
    run_dir = claim_run_dir(requested, fresh_if_taken="${now:" in run_dir_pattern())
    cfg.output_dir = str(run_dir)
    sweep = job_context()
    try:
        prepared = prepare(cfg, ranks_here=launcher.ranks_here, check_launcher=launcher.validate, shared_dir=sweep and sweep["dir"])
    except BaseException:
        release_run_dir(run_dir)
        raise
    if str(run_dir) != str(requested):
        print(f"qwen3_trn: {requested} was taken by a run started at the same time; this run writes to {run_dir}", flush=True)
    resume = prepared.resume
    warning = compile_warning(cfg)
    if warning:
        print(f"qwen3_trn: {warning}", file=sys.stderr, flush=True)
    for note in resume.notes() if resume else []:
        print(f"qwen3_trn: {note}", flush=True)
    node = OmegaConf.structured(cfg)  # typed: absolute paths, the claimed directory
    write_run_files(run_dir, node, _overrides(), prepared.trainer_config.to_dict())
    scrub_hydra_files(run_dir)
    if cfg.mode != Mode.train:
        launch = launcher.describe(prepared, run_dir)
        differences = config_differences(node, sweep["swept_keys"] if sweep else None)
        text = render_plan(prepared, launch, differences, run_dir)
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
    resumed = {"resumed_from": str(resume.path), "skipped_checkpoints": [f"{p}: {why}" for p, why in resume.skipped]} if resume else {}
    # the process that records the run's end: ``status`` settles the run as died once it is gone
    update_summary(run_dir, **info, **summary_fields(tracking), **resumed, status=RunStatus.running, process=this_process())
    if sweep is not None:  # jobs of a sweep run one after another in this process
        os.environ[LAUNCH_TIME_ENV] = str(time.time())
    else:
        os.environ.setdefault(LAUNCH_TIME_ENV, str(time.time()))
    started = time.perf_counter()
    status, error = RunStatus.failed, {}
    try:
        status = launcher.launch(prepared, prepared.trainer_config, detach=sweep is not None)
    except KeyboardInterrupt:
        status = RunStatus.interrupted
        raise
    except BaseException as exc:
        status = getattr(exc, "run_status", RunStatus.failed)  # e.g. cancelled: a waited-for launcher's job
        # A launcher that ends with SystemExit (a waited-for job elsewhere) has recorded the why itself.
        error = {} if isinstance(exc, SystemExit) else {"error": describe_error(exc)}
        if not isinstance(exc, SystemExit):
            write_text_atomic(run_dir / ERROR_LOG, f"{error['error']}\n\n{traceback.format_exc()}")
            error["error_log"] = str(run_dir / ERROR_LOG)
            try:
                exc.error_log = error["error_log"]  # for exit_status's message
            except AttributeError:
                pass
        raise
    finally:
        fields = {} if status == RunStatus.submitted else {"wall_time_s": time.perf_counter() - started}
        if status in (RunStatus.failed, RunStatus.interrupted) and (run_dir / METRICS_FILE).is_file():
            fields.update(summarize(read_metrics(run_dir)))  # the metrics rank may not have got to write them
        summary = update_summary(run_dir, status=status, **fields, **error)
    _print_summary(summary)
    return summary


@contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """SIGTERM stops a run like Ctrl-C, so its summary is still written."""

    def interrupt(signum, frame):
        raise RunInterrupted(signum)

    try:
        previous = signal.signal(signal.SIGTERM, interrupt)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run(cfg_node: DictConfig, typed: RunConfig | None = None) -> dict | None:
    """Hydra's task function, under ``exit_status``; ``typed``: the config ``answer_early`` typed,
    so that it is not typed twice. In a multirun a job's error is recorded and the sweep goes on
    (``qwen3_trn.sweeps.sweep``)."""
    redact_argv()
    if in_multirun():
        return run_sweep_job(execute, cfg_node)
    with exit_status(), _sigterm_interrupts(), no_run_dir_left():
        return execute(cfg_node, typed)
