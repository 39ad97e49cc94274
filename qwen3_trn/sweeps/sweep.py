"""Multirun sweeps on Hydra's basic launcher: failure isolation, manifest, summary.

Each job runs like a single run (``app.execute``). ``run_sweep_job`` records a job's error
(``NotApplicable``: skipped, else failed) instead of ending the sweep; ``SweepCallback`` writes
``sweep.json`` at the start and ``manifest.json``, the summary and the report at the end, and
exits 1 if a job failed. ``python -m qwen3_trn.sweeps <sweep dir>`` prints the summary again.
User-facing behaviour: docs/sweeps.md.
"""

from __future__ import annotations

import shlex
import sys
import time
import traceback
import uuid
from pathlib import Path
from typing import Any, Callable

from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import JobStatus
from hydra.experimental.callback import Callback
from omegaconf import OmegaConf

from qwen3_trn.cli.exits import imports_of_entry_point

# A torchtitan that lacks what the package uses: exit 2 as the command (qwen3_trn.cli.exits).
with imports_of_entry_point(__name__):
    from qwen3_trn.cli.early import in_multirun
    from qwen3_trn.common.errors import ConfigError, NotApplicable, describe_error
    from qwen3_trn.common.redact import redact_argv, redact_log_handlers, redact_overrides, remember_env
    from qwen3_trn.config.overrides import SEED_KEY, SEEDS_KEY, override_key
    from qwen3_trn.launch import launcher_named, launcher_of
    from qwen3_trn.report import build_report
    from qwen3_trn.report.search import BEST_FILE, SEARCH_HTML
    from qwen3_trn.results.processes import PROCESS_SECTION, this_process
    from qwen3_trn.results.quantities import QUANTITIES, REPORTED
    from qwen3_trn.results.records import (
        ERROR_LOG,
        IN_FLIGHT_STATUSES,
        JOB_FILE,
        JOB_SECTION,
        LOGS_DIR,
        MANIFEST_FILE,
        SUMMARY_FILE,
        RunStatus,
        died_fields,
        holds_run,
        job_label,
        job_records,
        job_section,
        read_job_record,
        read_manifest,
        read_summary,
        read_sweep_file,
        scrub_hydra_files,
        write_job_record,
        write_json_atomic,
        write_manifest_file,
        write_sweep_file,
        write_text_atomic,
    )
    from qwen3_trn.run.tracking import finish_dangling_run

# Counted in every sweep summary.
COUNTED_STATUSES = (RunStatus.completed, RunStatus.failed, RunStatus.skipped)
# Counted when present: jobs that run elsewhere (a launcher's job), only planned (mode=plan) or
# stopped early by a search's pruner (qwen3_trn.sweeps.search).
OTHER_STATUSES = (
    RunStatus.cancelled,
    RunStatus.interrupted,
    RunStatus.died,
    RunStatus.submitted,
    RunStatus.pending,
    RunStatus.running,
    RunStatus.planned,
    RunStatus.pruned,
)
# A job's record keeps the figures compared across runs, and what its validation loss was taken on.
FINAL_KEYS = (*REPORTED, "validation_tokens_sha256")


# ------------------------------------------------------------------------------------------
# Inside a job
# ------------------------------------------------------------------------------------------


def job_context() -> dict[str, Any] | None:
    """This job's place in the multirun, or None for a single run."""
    if not in_multirun():
        return None
    hydra_cfg = HydraConfig.get()
    sweep_dir = Path(str(hydra_cfg.sweep.dir)).resolve()
    shared = read_sweep_file(sweep_dir)
    overrides = redact_overrides(hydra_cfg.overrides.task)
    swept = shared.get("swept_keys") or []
    dirname = ",".join(redact_overrides(str(hydra_cfg.job.override_dirname or "").split(","))).strip(",")
    name = job_name(overrides, swept, int(hydra_cfg.job.num), dirname)
    return {
        "dir": str(sweep_dir),
        "num": int(hydra_cfg.job.num),
        "group": shared.get("group") or default_group(sweep_dir),
        "experiment": shared.get("experiment"),
        "swept_keys": swept,
        "name": name,
        "overrides": overrides,
        "job_dir": str(Path(hydra_cfg.runtime.output_dir).resolve()),
    }


def job_name(overrides: list[str], swept: list[str], num: int, fallback: str = "") -> str:
    """The job's swept overrides (``model.top_k=2,backend=hf_v5``)."""
    return ",".join(o for o in redact_overrides(overrides) if override_key(o) in swept) or fallback or f"job{num}"


def default_group(sweep_dir: Path) -> str:
    """The sweep directory's last two parts, when sweep.json is missing."""
    return "sweep-" + "_".join(sweep_dir.parts[-2:])


def _final_figures(summary: dict[str, Any] | None) -> dict[str, Any]:
    return {k: summary[k] for k in FINAL_KEYS if summary and summary.get(k) is not None}


def rerun_command(overrides: list[str]) -> str:
    """A single-run command for one job (``hydra.mode=RUN`` keeps an experiment's sweep off)."""
    return " ".join(["python -m qwen3_trn", "hydra.mode=RUN", *(shlex.quote(o) for o in overrides)])


def _foreign_record_path(sweep_dir: Path, num: int) -> Path:
    """Where the record of a job whose directory already held another run goes."""
    return sweep_dir / f"job-{num}.json"


def run_sweep_job(execute: Callable[[Any], dict | None], cfg_node: Any) -> dict[str, Any]:
    """Run one multirun job; record its outcome instead of raising, so the sweep goes on."""
    ctx = job_context() or {}
    job_dir = Path(ctx.get("job_dir", "."))
    foreign = holds_run(job_dir)
    record: dict[str, Any] = {
        "num": ctx.get("num"),
        "name": ctx.get("name"),
        "overrides": ctx.get("overrides", []),
        "run_dir": str(job_dir),
        "status": RunStatus.running,
        "started": time.time(),
    }
    summary = None
    if not foreign:  # until it ends: a job whose process is killed hard reads as died (``settle_jobs``)
        write_job_record(job_dir, {**record, PROCESS_SECTION: this_process()})
    try:
        summary = execute(cfg_node)
        # a job that runs elsewhere (its launcher's job section) and mode=plan
        record["status"] = (
            RunStatus(summary["status"])
            if summary and summary.get("status") in (RunStatus.submitted, RunStatus.planned)
            else RunStatus.completed
        )
    except NotApplicable as exc:
        record.update(status=RunStatus.skipped, reason=str(exc), error_key=exc.key)
    except KeyboardInterrupt:
        record.update(status=RunStatus.interrupted, ended=time.time())
        if not foreign:
            write_job_record(job_dir, record)
        raise
    except BaseException as exc:  # noqa: BLE001 - a sweep records every failure and goes on
        if getattr(exc, "run_status", None) == RunStatus.pruned:  # a search's pruner stopped this trial
            record.update(status=RunStatus.pruned, reason=str(exc))
        else:
            record.update(status=RunStatus.failed, error=describe_error(exc), error_type=type(exc).__name__)
            if isinstance(exc, ConfigError):
                record["error_key"] = exc.key
            record["traceback"] = traceback.format_exc()
    finally:
        finish_dangling_run(exit_code=0 if record["status"] in (RunStatus.completed, RunStatus.pruned) else 1)
        _destroy_process_group()
    record["ended"] = time.time()
    if summary is None and (job_dir / SUMMARY_FILE).is_file() and not foreign:
        summary = _pruned_run(job_dir, read_summary(job_dir))
        if record["status"] == RunStatus.failed and summary.get("status") == RunStatus.pruned:
            record.update(status=RunStatus.pruned, reason=_pruned_reason(summary))
            for key in ("error", "error_type", "error_key", "traceback"):
                record.pop(key, None)
    if summary:
        record["final"] = _final_figures(summary)
        if summary.get("wandb_run_id"):
            record["wandb_run_id"] = summary["wandb_run_id"]
        if (summary.get("wandb_run") or {}).get("run_dir"):
            record["wandb_dir"] = summary["wandb_run"]["run_dir"]
        for key in (JOB_SECTION, "plan"):  # the launcher's job (id, state, logs); a planned job's world and submission
            if summary.get(key):
                record[key] = summary[key]
        if job_section(summary) and record["status"] != RunStatus.failed:
            record["log"] = job_section(summary).get("stdout")
    if record["status"] == RunStatus.failed:
        record["rerun"] = rerun_command(record["overrides"])
    if not foreign:
        job_dir.mkdir(parents=True, exist_ok=True)
        if record["status"] == RunStatus.failed:
            logs = sorted(str(p) for p in (job_dir / LOGS_DIR).glob("rank*.log")) if (job_dir / LOGS_DIR).is_dir() else []
            write_text_atomic(
                job_dir / ERROR_LOG,
                f"job {record['num']}: {' '.join(record['overrides'])}\n{record['error']}\n\n{record.pop('traceback')}"
                + (f"\nrank logs: {', '.join(logs)}\n" if logs else ""),
            )
            record["log"] = str(job_dir / ERROR_LOG)
            if logs:
                record["rank_logs"] = logs
        write_job_record(job_dir, record)
    else:
        record.pop("traceback", None)
        record["note"] = f"{job_dir} already held a run; nothing was written there"
        if ctx.get("dir") and record["num"] is not None:
            write_json_atomic(_foreign_record_path(Path(ctx["dir"]), record["num"]), record)
    print(f"[sweep] {_job_line(record)}", flush=True)
    if ctx.get("dir"):  # so that an interrupted sweep still shows what ran
        try:
            write_manifest(Path(ctx["dir"]), collect_jobs(Path(ctx["dir"])), {"complete": False})
        except OSError:
            pass
    return record


def _pruned_run(run_dir: Path, summary: dict[str, Any]) -> dict[str, Any]:
    """A trial its pruner stopped, which its launcher saw fail, as status ``pruned`` with no
    error; any other summary as it is."""
    if not summary.get("pruned") or summary.get("status") != RunStatus.failed:
        return summary
    summary = {k: v for k, v in summary.items() if k not in ("error", "error_log", "job_error")}
    summary["status"] = str(RunStatus.pruned)
    write_json_atomic(Path(run_dir) / SUMMARY_FILE, summary)
    (Path(run_dir) / ERROR_LOG).unlink(missing_ok=True)
    return summary


def _pruned_reason(summary: dict[str, Any]) -> str:
    pruned = summary.get("pruned") or {}
    return f"pruned by the search at step {pruned.get('step')} (validation loss {pruned.get('val_loss', float('nan')):.4f})"


def _destroy_process_group() -> None:
    torch = sys.modules.get("torch")
    if torch is not None and torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


# ------------------------------------------------------------------------------------------
# Manifest and summary
# ------------------------------------------------------------------------------------------


def _job_line(job: dict[str, Any]) -> str:
    label = job.get("name") or " ".join(job.get("overrides", []))
    status = str(job.get("status", "?"))
    head = f"#{job.get('num')} {status.upper() if status == RunStatus.failed else status:<9} {label}"
    if status == RunStatus.completed:
        f = job.get("final", {})
        q = QUANTITIES
        parts = []
        if "first_loss" in f and "last_loss" in f:
            parts.append(f"loss {q['first_loss'].format(f['first_loss'])} -> {q['last_loss'].format(f['last_loss'])}")
        if "val_loss" in f:
            parts.append(f"val loss {q['val_loss'].format(f['val_loss'])}")
        parts += [q[key].with_unit(f[key]) for key in ("tokens_per_s", "peak_memory_gib") if key in f]
        return f"{head}: {', '.join(parts)}  ({job.get('run_dir')})"
    if status == RunStatus.skipped:
        return f"{head}: {'invalid' if job.get('invalid') else 'does not apply'}: {job.get('reason')}"
    if status == RunStatus.pruned:
        return f"{head}: {job.get('reason')}  ({job.get('run_dir')})"
    if status == RunStatus.failed:
        return f"{head}: {job.get('error')}  (log: {job.get('log') or job.get('run_dir')})"
    if status == RunStatus.died:
        return f"{head}: {job.get('error')}  ({job.get('run_dir')})"
    if status == RunStatus.planned and job.get("plan"):
        plan = job["plan"]
        return f"{head}: world {plan.get('world_size')} on {plan.get('where')}  (plan: {plan.get('plan_file')})"
    remote = job_section(job)
    if remote:
        return f"{head}: {job_label(remote)} {remote.get('state') or ''}  (log: {remote.get('stdout')})"
    return head


def collect_jobs(sweep_dir: Path) -> list[dict[str, Any]]:
    """Every job of the sweep from its records: job.json, or the sweep directory's job-<num>.json
    for a job whose directory held another run."""
    jobs = job_records(sweep_dir)
    for path in sorted(sweep_dir.glob("job-*.json")):
        job = read_job_record(path)
        if job and job.get("num") is not None:
            jobs.setdefault(int(job["num"]), job)
    return [jobs[n] for n in sorted(jobs)]


def write_manifest(sweep_dir: Path, jobs: list[dict[str, Any]], extra: dict[str, Any] | None = None) -> dict[str, Any]:
    shared = read_sweep_file(sweep_dir)
    counts = {str(s): sum(1 for j in jobs if j.get("status") == s) for s in COUNTED_STATUSES}
    counts.update({str(s): n for s in OTHER_STATUSES if (n := sum(1 for j in jobs if j.get("status") == s))})  # only when present
    manifest = {
        "sweep_dir": str(sweep_dir),
        "group": shared.get("group") or default_group(sweep_dir),
        "experiment": shared.get("experiment"),
        "swept_keys": shared.get("swept_keys", []),
        "seeds": shared.get("seeds", 1),
        "command": shared.get("command"),
        "started": shared.get("started"),
        "finished": time.time(),
        "counts": {**counts, "total": len(jobs)},
        "jobs": jobs,
        "rerun_failed": [j["rerun"] for j in jobs if j.get("status") in (RunStatus.failed, RunStatus.died) and j.get("rerun")],
        **(extra or {}),
    }
    if (sweep_dir / SEARCH_HTML).is_file():  # a search (qwen3_trn.sweeps.search): its report and best trial
        manifest["search"] = {
            "report": str(sweep_dir / SEARCH_HTML),
            "best": str(sweep_dir / BEST_FILE) if (sweep_dir / BEST_FILE).is_file() else None,
        }
    write_manifest_file(sweep_dir, manifest)
    return manifest


def format_summary(manifest: dict[str, Any]) -> str:
    c = manifest["counts"]
    lines = [
        f"== sweep {manifest['sweep_dir']} ==",
        f"{c['total']} jobs: {c['completed']} completed, {c['failed']} failed, {c['skipped']} skipped"
        + "".join(f", {c[s]} {s}" for s in map(str, OTHER_STATUSES) if c.get(s))
        + f"   (wandb group {manifest['group']}; swept: {', '.join(manifest['swept_keys']) or '-'}"
        + (f"; {manifest['seeds']} seeds per config)" if manifest.get("seeds", 1) > 1 else ")"),
    ]
    lines += ["  " + _job_line(job) for job in manifest["jobs"]]
    if c["total"] and c["skipped"] == c["total"]:
        lines.append("warning: every job was skipped, nothing trained (e.g. MoE keys with a dense model: add model=tiny_moe)")
    lines.append(f"manifest: {Path(manifest['sweep_dir']) / MANIFEST_FILE}")
    if manifest.get("report"):
        lines.append(f"report:   {manifest['report']}")
    if manifest.get("search"):
        lines.append(
            f"search:   {manifest['search']['report']}" + (f"  (best: {manifest['search']['best']})" if manifest["search"]["best"] else "")
        )
    if manifest["rerun_failed"]:
        lines.append("rerun the failed jobs:")
        lines += [f"  {cmd}" for cmd in manifest["rerun_failed"]]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------
# Jobs that run elsewhere (a launcher's job): their states into the records
# ------------------------------------------------------------------------------------------


def _merge_into_record(record: dict[str, Any], summary: dict[str, Any]) -> None:
    job = job_section(summary)
    if job:
        record[JOB_SECTION] = job
    if job.get("started") is not None:  # a job run elsewhere: its own wall times, not its submission's
        record["started"] = job["started"]
        if job.get("ended") is not None:
            record["ended"] = job["ended"]
        else:
            record.pop("ended", None)
    status = summary.get("status") or record.get("status")
    if status == RunStatus.pruned:
        record["reason"] = _pruned_reason(summary)
    record["status"] = status
    record["log"] = job.get("stderr") if status == RunStatus.failed else job.get("stdout")
    final = _final_figures(summary)
    if final:
        record["final"] = final
    if status == RunStatus.died:
        record["error"] = summary.get("error")
        record["last_step"] = summary.get("last_step")
        record["rerun"] = rerun_command(record.get("overrides", []))
    elif status == RunStatus.failed:
        record["error"] = summary.get("error") or f"{job_label(job)} {job.get('state')}"
    else:
        record.pop("error", None)
    if summary.get("wandb_run_id"):
        record["wandb_run_id"] = summary["wandb_run_id"]


def _sync_job_record(run_dir: Path, summary: dict[str, Any]) -> None:
    """Bring a job's job.json in line with its run's summary."""
    record = read_job_record(run_dir)
    if record is None or (not job_section(summary) and record.get("status") == summary.get("status")):
        return
    _merge_into_record(record, summary)
    if record["status"] == RunStatus.failed:
        record["rerun"] = rerun_command(record.get("overrides", []))
        logs = ", ".join(job_section(summary).get("logs", []))
        write_text_atomic(
            run_dir / ERROR_LOG, f"job {record.get('num')}: {' '.join(record.get('overrides', []))}\n{record.get('error')}\nlogs: {logs}\n"
        )
    write_job_record(run_dir, record)


def refresh_runs(run_dirs: list[Path], wait: bool = False) -> list[dict[str, Any]]:
    """Update each run's summary (and sweep job record) from its launcher, waiting for the end when
    ``wait``. Returns the summaries."""
    by_launcher: dict[str, list[Path]] = {}
    for run_dir in run_dirs:
        summary = read_summary(run_dir)
        name = job_section(summary).get("launcher") or summary.get("launcher") or "local"
        by_launcher.setdefault(name, []).append(Path(run_dir))
    summaries = []
    for name, dirs in by_launcher.items():
        for refreshed in launcher_named(name).refresh(dirs, wait=wait):
            summary = _pruned_run(Path(refreshed["run_dir"]), refreshed)
            _sync_job_record(Path(summary["run_dir"]), summary)
            summaries.append(summary)
    return summaries


def settle_jobs(jobs: list[dict[str, Any]], wait: bool = False) -> list[dict[str, Any]]:
    """The jobs, with current states for those still in flight elsewhere."""
    in_flight = [job for job in jobs if job.get("status") in IN_FLIGHT_STATUSES and job.get("run_dir")]
    summaries = {str(Path(s["run_dir"])): s for s in refresh_runs([Path(j["run_dir"]) for j in in_flight], wait=wait)}
    for job in in_flight:
        summary = summaries.get(str(Path(job["run_dir"])))
        if summary is not None:
            _merge_into_record(job, summary)
        elif died := died_fields(job, Path(job["run_dir"])):  # killed before its run wrote a summary
            job.update(died, rerun=rerun_command(job.get("overrides", [])))
            write_job_record(Path(job["run_dir"]), job)
    return jobs


def refresh_sweep(sweep_dir: Path, wait: bool = False) -> dict[str, Any]:
    """Refresh a sweep's jobs and rewrite its manifest (and its report once all ended)."""
    jobs = settle_jobs(collect_jobs(sweep_dir), wait=wait)
    in_flight = any(j.get("status") in IN_FLIGHT_STATUSES for j in jobs)
    previous = read_manifest(sweep_dir) or {}
    extra: dict[str, Any] = {"complete": not in_flight}
    if not in_flight and previous.get("report"):
        extra["report"] = previous["report"]
    manifest = write_manifest(sweep_dir, jobs, extra)
    if not in_flight and not previous.get("report"):
        try:
            result = build_report([sweep_dir], out_dir=sweep_dir)
            manifest = write_manifest(sweep_dir, jobs, {**extra, "report": str(result.html), "report_notes": result.notes})
        except Exception as exc:  # noqa: BLE001 - the states matter more than the report
            manifest = write_manifest(sweep_dir, jobs, {**extra, "report_error": f"{type(exc).__name__}: {exc}"})
    return manifest


# ------------------------------------------------------------------------------------------
# Hydra callback
# ------------------------------------------------------------------------------------------


def _sweep_overrides(config: Any) -> dict[str, Any]:
    """The sweep's overrides by key: ``hydra.sweeper.params``, then the command line (which wins)."""
    params = config.hydra.sweeper.get("params") or {}
    entries = [f"{k}={v}" for k, v in params.items()] + list(config.hydra.overrides.task)
    try:
        parsed = OverridesParser.create().parse_overrides(entries)
    except Exception:  # noqa: BLE001 - the sweeper itself reports malformed overrides
        return {}
    final: dict[str, Any] = {}
    for override in parsed:
        final[override.get_key_element().lstrip("+~")] = override
    return final


def sweep_seeds(config: Any) -> int:
    """``sweep.seeds``, or 1 when not a number."""
    seeds = OmegaConf.select(config, SEEDS_KEY, default=1)
    return seeds if isinstance(seeds, int) and seeds > 1 else 1


def swept_keys(config: Any) -> list[str]:
    """``hydra.sweeper.params``, the command line's sweep overrides, and the seed when
    ``sweep.seeds`` replicates every job."""
    keys = [key for key, override in _sweep_overrides(config).items() if override.is_sweep_override()]
    return [*keys, SEED_KEY] if sweep_seeds(config) > 1 and SEED_KEY not in keys else keys


def unknown_group_options(config: Any) -> list[str]:
    """Swept group options that do not exist, which Hydra would only find when it reaches the job
    and then stop the sweep."""
    if not GlobalHydra.instance().is_initialized():
        return []
    loader = GlobalHydra.instance().config_loader()
    groups = set(config.hydra.runtime.choices.keys())
    problems = []
    for key, override in _sweep_overrides(config).items():
        if key not in groups or not override.is_sweep_override():
            continue
        try:
            values = list(override.sweep_string_iterator())
            options = loader.get_group_options(key)
        except Exception:  # noqa: BLE001 - glob() and friends: let Hydra resolve them
            continue
        missing = [v for v in values if v not in options and v != "null"]
        if missing:
            problems.append(f"{key}={','.join(missing)}: no such option in group '{key}' (available: {', '.join(options)})")
    return problems


def start_sweep_record(config: Any, resumed: bool = False) -> None:
    """Write ``<sweep dir>/sweep.json`` (wandb group, swept keys, command). A resumed sweep keeps
    its group and start time, so old and new jobs stay one group."""
    sweep_dir = Path(str(config.hydra.sweep.dir)).resolve()
    sweep_dir.mkdir(parents=True, exist_ok=True)
    earlier = read_sweep_file(sweep_dir) if resumed else {}
    experiment = config.hydra.runtime.choices.get("experiment")
    experiment = None if experiment in (None, "null") else str(experiment)
    configured = config.get("logger", {}).get("wandb", {}).get("group")
    group = configured or f"{experiment or 'sweep'}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}"
    command = " ".join(["python -m qwen3_trn", *(shlex.quote(a) for a in sys.argv[1:])])
    shared = {
        "dir": str(sweep_dir),
        "group": earlier.get("group") or group,
        "experiment": experiment,
        "swept_keys": swept_keys(config),
        "seeds": sweep_seeds(config),
        "command": command,
        "started": earlier.get("started") or time.time(),
        **({"resumed": [*earlier.get("resumed", []), {"at": time.time(), "command": command}]} if earlier else {}),
    }
    write_sweep_file(sweep_dir, shared)


class SweepCallback(Callback):
    """Hydra callback that turns a multirun into a sweep with a manifest and a report."""

    def __init__(self, report: bool = True, publish: bool = False) -> None:
        self.report = report
        self.publish = publish

    def on_multirun_start(self, config: Any, **kwargs: Any) -> None:
        redact_argv()
        remember_env(config.get("launcher", {}).get("env") or {})
        redact_log_handlers()  # Hydra logs each job's overrides
        problems = unknown_group_options(config)
        if problems:  # before any job runs, rather than a crash at that job
            print("error: this sweep cannot run:\n  " + "\n  ".join(problems), file=sys.stderr, flush=True)
            sys.exit(2)

    def on_job_start(self, config: Any, **kwargs: Any) -> None:
        """Rewrite multirun.yaml, which Hydra wrote with secrets, redacted."""
        scrub_hydra_files(Path(str(config.hydra.sweep.dir)))

    def on_job_end(self, config: Any, job_return: Any, **kwargs: Any) -> None:
        """Record a job whose error escaped ``run_sweep_job``."""
        if job_return is None or job_return.status != JobStatus.FAILED:
            return
        num = int(config.hydra.job.num)
        sweep_dir = Path(str(config.hydra.sweep.dir)).resolve()
        recorded = [job for job in collect_jobs(sweep_dir) if job.get("num") == num]
        if any(job.get("status") != RunStatus.running for job in recorded):
            return
        error = job_return._return_value
        write_json_atomic(
            Path(recorded[0]["run_dir"]) / JOB_FILE if recorded else _foreign_record_path(sweep_dir, num),
            {
                "num": num,
                "name": ",".join(redact_overrides(str(config.hydra.job.override_dirname or "").split(","))),
                "overrides": redact_overrides(job_return.overrides or []),
                "run_dir": str(Path(str(config.hydra.runtime.output_dir)).resolve()),
                "status": RunStatus.failed,
                "error": f"{type(error).__name__}: {error}",
                "rerun": rerun_command(redact_overrides(job_return.overrides or [])),
            },
        )

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir)).resolve()
        jobs = settle_jobs(collect_jobs(sweep_dir), wait=launcher_of(config.get("launcher")).waits_for_jobs)
        planned = read_manifest(sweep_dir) or {}
        if not jobs and planned.get("planned"):  # a planned sweep: the sweeper wrote its manifest, no job ran
            print(format_summary(planned), flush=True)
            return
        in_flight = any(job.get("status") in IN_FLIGHT_STATUSES for job in jobs)
        manifest = write_manifest(sweep_dir, jobs, {"complete": not in_flight})
        if in_flight:
            print(
                f"[sweep] jobs still queued or running elsewhere; refresh their states with: python -m qwen3_trn.status {sweep_dir}",
                flush=True,
            )
        if self.report and jobs and not in_flight and not all(job.get("status") == RunStatus.planned for job in jobs):
            try:
                result = build_report([sweep_dir], out_dir=sweep_dir, publish=self.publish)
                manifest = write_manifest(sweep_dir, jobs, {"complete": True, "report": str(result.html), "report_notes": result.notes})
            except Exception as exc:  # noqa: BLE001 - the sweep's outcome must still be reported
                manifest = write_manifest(sweep_dir, jobs, {"complete": True, "report_error": f"{type(exc).__name__}: {exc}"})
                print(f"[sweep] the comparison report could not be built: {type(exc).__name__}: {exc}", file=sys.stderr)
        print(format_summary(manifest), flush=True)
        if manifest["counts"]["failed"] or manifest["counts"].get("cancelled") or manifest["counts"].get("died"):
            print(
                f"[sweep] {manifest['counts']['failed']} of {manifest['counts']['total']} jobs failed"
                + "".join(f", {manifest['counts'][s]} {s}" for s in ("cancelled", "died") if manifest["counts"].get(s)),
                file=sys.stderr,
                flush=True,
            )
            sys.exit(1)


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m qwen3_trn.sweeps", description="Print a finished sweep's summary.")
    parser.add_argument("sweep_dir")
    args = parser.parse_args(argv)
    manifest = read_manifest(Path(args.sweep_dir))
    if manifest is None:
        parser.error(f"{Path(args.sweep_dir) / MANIFEST_FILE} does not exist (is {args.sweep_dir} a sweep directory?)")
    print(format_summary(manifest))
    sys.exit(1 if manifest["counts"]["failed"] else 0)


if __name__ == "__main__":
    main()
