"""Finding runs (sweep directories, run directories, or folders holding them) and loading each
from its own record, read through ``qwen3_trn.results.records``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qwen3_trn.config.overrides import SEED_KEY
from qwen3_trn.report.seeds import Spread, spread
from qwen3_trn.results.records import RunStatus, read_job_record, read_manifest, read_summary, summarize

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
    seed: int | None = None
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
    seed = summary.get("seed", run.params.get(SEED_KEY))
    run.seed = int(seed) if seed is not None else None
    run.note = job.get("reason") or job.get("error") or ""
    run.records = _read_metrics(run_dir)
    run.source = "metrics" if run.records else "none"
    run.figures = summarize(run.records) if run.records else {k: v for k, v in summary.items() if k in ("steps_logged",)}
    run.figures.update({k: summary[k] for k in SUMMARY_FIELDS if summary.get(k) is not None})
    if run.status == "unknown" and run.records:
        run.status = RunStatus.completed
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
class ConfigRuns:
    """One config of the collection (its swept values but the seed) and its runs, one per seed."""

    label: str
    params: dict[str, str]
    runs: list[RunData]

    @property
    def trained(self) -> list[RunData]:
        return [r for r in self.runs if r.records]

    def spread(self, key: str) -> Spread | None:
        """``key`` over this config's trained runs (its seeds)."""
        return spread(r.figures.get(key) for r in self.trained)

    @property
    def seeds(self) -> list[int]:
        return sorted(r.seed for r in self.trained if r.seed is not None)


@dataclass
class Collection:
    runs: list[RunData]
    swept_keys: list[str]
    groups: list[str]
    sweep_dirs: list[Path]
    title: str
    subtitle: str = ""

    @property
    def config_keys(self) -> list[str]:
        """The swept keys that make configs (the seed makes replicates of one)."""
        return [k for k in self.swept_keys if k != SEED_KEY]

    @property
    def configs(self) -> list[ConfigRuns]:
        """The runs grouped by config, in the order of their first run."""
        by_label: dict[str, ConfigRuns] = {}
        for run in self.runs:
            params = {k: run.params[k] for k in self.config_keys if k in run.params}
            label = ", ".join(f"{k}={v}" for k, v in params.items()) or "all runs"
            by_label.setdefault(label, ConfigRuns(label, params, [])).runs.append(run)
        return list(by_label.values())

    @property
    def seeds_per_config(self) -> int:
        """The fewest seeds a trained config has (0: nothing trained)."""
        counts = [len(c.trained) for c in self.configs if c.trained]
        return min(counts) if counts else 0


def collect(paths: list[Path]) -> Collection:
    """Runs from sweep directories (every job of their manifest, failed and skipped ones too), run
    directories, or folders holding either."""
    runs: list[RunData] = []
    manifest_keys: list[str] = []
    experiments: list[str] = []
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
            if manifest.get("experiment") and manifest["experiment"] not in experiments:
                experiments.append(manifest["experiment"])
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
        if run.wandb_group and run.wandb_group not in groups and run.status == RunStatus.completed:
            groups.append(run.wandb_group)
    keys = swept_keys(runs, manifest_keys)
    _label(runs, keys)
    collection = Collection(runs=runs, swept_keys=keys, groups=groups, sweep_dirs=sweep_dirs, title="")
    collection.title = _title(collection, experiments, [k for k in manifest_keys if k != SEED_KEY])
    collection.subtitle = "; ".join(f"sweep directory: {_shown_path(d)}" for d in sweep_dirs)
    return collection


def _shown_path(path: Path) -> str:
    """A path relative to the working directory where it lies below it, else as it is."""
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _title(collection: Collection, experiments: list[str], sweep_keys: list[str]) -> str:
    """What the runs are: ``experiment=moe_grid: model.top_k × model.n_layers, 2 seeds each`` (the
    keys its sweeps varied, else those that differ between the runs)."""
    what = "Sweep " + " + ".join(f"experiment={e}" for e in experiments) if experiments else ("Sweep" if collection.sweep_dirs else "Runs")
    keys = " × ".join(sweep_keys or collection.config_keys) or "one config"
    seeds = collection.seeds_per_config
    return f"{what}: {keys}" + (f", {seeds} seeds each" if seeds > 1 else "")


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
