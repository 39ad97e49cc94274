"""Finding runs (a sweep directory, run directories, or folders holding them) and loading each
one from its own record: ``metrics.jsonl`` (per step) and ``summary.json`` (the run's facts),
plus ``overrides.yaml`` / ``job.json`` for what was swept and how the job ended, each read
through ``qwen3_trn.records`` (records of earlier versions in the current shape)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qwen3_trn.records import read_job_record, read_manifest, read_summary, summarize

RUN_FILES = ("config.yaml", "summary.json", "metrics.jsonl", "job.json", "overrides.yaml")


class ReportError(ValueError):
    pass


@dataclass
class RunData:
    run_dir: Path | None
    status: str
    overrides: list[str] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)
    records: list[dict[str, Any]] = field(default_factory=list)
    source: str = "none"
    num: int | None = None
    note: str = ""
    backend: str | None = None
    wandb_run_id: str | None = None
    wandb_group: str | None = None
    # summary.json's wandb section (project, entity, mode, ...) and the run's local wandb directory
    wandb: dict[str, Any] = field(default_factory=dict)
    wandb_dir: str | None = None
    label: str = ""

    @property
    def params(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for override in self.overrides:
            if "=" in override:
                key, value = override.split("=", 1)
                out[key.lstrip("+~")] = value
        return out


def _read_overrides(run_dir: Path) -> list[str] | None:
    path = run_dir / "overrides.yaml"
    if not path.is_file():
        return None
    from omegaconf import OmegaConf

    return [str(o) for o in OmegaConf.to_container(OmegaConf.load(path))]


def _read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    records = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line:
            try:
                records.append(json.loads(line))
            except ValueError:
                continue  # a torn last line of a killed run
    return records


# summary.json facts a report shows next to the per-step figures
SUMMARY_FIELDS = ("wall_time_s", "validation_tokens_sha256", "validation_tokens", "hf_export")


def load_run(run_dir: Path, job: dict[str, Any] | None = None) -> RunData:
    """One run, from its metrics.jsonl and summary.json."""
    run_dir = Path(run_dir)
    job = job or read_job_record(run_dir) or {}
    summary = read_summary(run_dir)
    overrides = _read_overrides(run_dir)
    wandb = summary.get("wandb") or {}
    run = RunData(
        run_dir=run_dir if run_dir.exists() else None,
        status=job.get("status") or summary.get("status") or "unknown",
        num=job.get("num"),
        backend=summary.get("backend"),
        wandb_run_id=summary.get("wandb_run_id") or job.get("wandb_run_id"),
        wandb_group=wandb.get("group"),
        wandb=wandb,
        wandb_dir=(summary.get("wandb_run") or {}).get("run_dir"),
    )
    run.overrides = overrides if overrides is not None else list(job.get("overrides", []))
    run.note = job.get("reason") or job.get("error") or ""
    run.records = _read_metrics(run_dir)
    run.source = "metrics" if run.records else "none"
    run.figures = summarize(run.records) if run.records else {k: v for k, v in summary.items() if k in ("steps_logged",)}
    run.figures.update({k: summary[k] for k in SUMMARY_FIELDS if summary.get(k) is not None})
    if run.status == "unknown" and run.records:
        run.status = "completed"
    return run


def _is_run_dir(path: Path) -> bool:
    return any((path / name).exists() for name in RUN_FILES)


def _find_run_dirs(root: Path, depth: int = 3) -> list[Path]:
    if _is_run_dir(root):
        return [root]
    if depth == 0 or not root.is_dir():
        return []
    found: list[Path] = []
    for child in sorted(root.iterdir(), key=lambda p: (len(p.name), p.name)):
        if child.is_dir() and child.name not in ("wandb", "logs", "checkpoint", "tb", "comm_traces"):
            found += _find_run_dirs(child, depth - 1)
    return found


@dataclass
class Collection:
    runs: list[RunData]
    swept_keys: list[str]
    groups: list[str]
    sweep_dirs: list[Path]
    title: str


def collect(paths: list[Path]) -> Collection:
    """Runs from sweep directories (their manifest.json lists every job, failed and skipped
    ones too), run directories, or folders holding either."""
    runs: list[RunData] = []
    manifest_keys: list[str] = []
    groups: list[str] = []
    sweep_dirs: list[Path] = []
    seen: set[Path] = set()
    for path in map(Path, paths):
        if not path.exists():
            raise ReportError(f"{path} does not exist")
        manifest = read_manifest(path) if path.is_dir() else None
        if manifest:
            sweep_dirs.append(path)
            if manifest.get("group"):
                groups.append(manifest["group"])
            manifest_keys += [k for k in manifest.get("swept_keys", []) if k not in manifest_keys]
            for job in manifest.get("jobs", []):
                run_dir = Path(job.get("run_dir") or path / str(job.get("num")))
                if not run_dir.is_absolute():
                    run_dir = path / run_dir
                seen.add(run_dir.resolve())
                runs.append(load_run(run_dir, job))
            continue
        for run_dir in _find_run_dirs(path):
            if run_dir.resolve() in seen:
                continue
            seen.add(run_dir.resolve())
            runs.append(load_run(run_dir))
    if not runs:
        raise ReportError(
            f"no runs found in {', '.join(map(str, paths))} (a run directory holds summary.json / metrics.jsonl; "
            "a sweep directory holds manifest.json)"
        )
    for run in runs:
        if run.wandb_group and run.wandb_group not in groups and run.status == "completed":
            groups.append(run.wandb_group)
    keys = swept_keys(runs, manifest_keys)
    _label(runs, keys)
    title = "Sweep " + ", ".join(str(d) for d in sweep_dirs) if sweep_dirs else f"{len(runs)} runs"
    return Collection(runs=runs, swept_keys=keys, groups=groups, sweep_dirs=sweep_dirs, title=title)


def swept_keys(runs: list[RunData], known: list[str] | None = None) -> list[str]:
    """Override keys whose value differs between runs (a key some runs lack counts too)."""
    keys: list[str] = []
    all_keys: list[str] = []
    for run in runs:
        all_keys += [k for k in run.params if k not in all_keys]
    for key in [*(known or []), *all_keys]:
        values = {run.params.get(key) for run in runs}
        if len(values) > 1 and key not in keys:
            keys.append(key)
    return keys


def _label(runs: list[RunData], keys: list[str]) -> None:
    used: dict[str, int] = {}
    for index, run in enumerate(runs):
        label = ", ".join(f"{k}={run.params[k]}" for k in keys if k in run.params)
        if not label:
            label = run.run_dir.name if run.run_dir else f"run {index}"
        if label in used:
            label = f"{label} (#{run.num if run.num is not None else index})"
        used[label] = 1
        run.label = label
