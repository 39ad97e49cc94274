"""Optionally publish a wandb Report with the local report's panels.

Needs ``wandb-workspaces`` (not a dependency), an API key and the network; offline runs are
synced first. Anything missing is said in one line; the local report is written either way.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from qwen3_trn.report.figures import GRID_FIGURES, final_loss_key, grid_keys, ordered_values, trained
from qwen3_trn.report.runs import Collection
from qwen3_trn.results.quantities import QUANTITIES
from qwen3_trn.run.tracking import wandb_api_key


def _offline_dirs(collection: Collection) -> list[Path]:
    """The offline wandb run directories the runs' summaries name."""
    return [
        Path(run.wandb_dir)
        for run in collection.runs
        if run.wandb_dir and Path(run.wandb_dir).name.startswith("offline-run-") and Path(run.wandb_dir).is_dir()
    ]


def publish_report(collection: Collection, title: str | None = None) -> tuple[bool, str]:
    """(published?, one line saying what happened)."""
    try:
        import wandb_workspaces.reports.v2 as wr
    except ImportError:
        return False, "wandb Report not published: wandb-workspaces is not installed (pip install wandb-workspaces)."
    if not wandb_api_key():
        return False, "wandb Report not published: no wandb API key (set WANDB_API_KEY or run `wandb login`)."
    project = entity = None
    for run in collection.runs:
        project, entity = run.wandb.get("project") or project, run.wandb.get("entity") or entity
    if project is None:
        return False, "wandb Report not published: none of these runs logged to wandb (logger=wandb)."
    reachable, why = _server_reachable()
    if not reachable:
        return False, f"wandb Report not published: cannot reach the wandb server ({why})."
    offline = _offline_dirs(collection)
    if offline:
        done = subprocess.run([sys.executable, "-m", "wandb", "sync", *map(str, offline)], capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            return False, f"wandb Report not published: `wandb sync` of the offline runs failed: {done.stderr.strip()[-300:]}"
    try:
        report = wandb_report(wr, collection, project, entity, title)
        report.save()
    except Exception as exc:  # noqa: BLE001 - no permission, server error...: the local report stands
        return False, f"wandb Report not published: {type(exc).__name__}: {str(exc)[:300]}"
    return True, f"wandb Report published: {getattr(report, 'url', '(see the project reports)')}"


def _server_reachable(timeout: float = 5.0) -> tuple[bool, str]:
    import socket
    from urllib.parse import urlparse

    url = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai"))
    host, port = url.hostname or "api.wandb.ai", url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True, ""
    except OSError as exc:
        return False, f"{host}:{port}: {exc}"


def _numeric_key(collection: Collection, key: str) -> bool:
    return ordered_values([run.params[key] for run in collection.runs if key in run.params])[1]


def _axis(wr, collection: Collection, key: str):
    """A swept key as a wandb config column: its typed value from config.yaml for a numeric key,
    else its override string (run.params)."""
    return wr.Config(key) if _numeric_key(collection, key) else wr.Config(f"run.params.{key}")


def report_panels(wr, collection: Collection) -> list:
    """The wandb panels for the collection (the local report's figures)."""
    figure_key, name = final_loss_key(trained(collection.runs))
    panels = [
        wr.LinePlot(title="training and validation loss", x="Step", y=["loss", "val_loss"]),
        wr.BarPlot(title="tokens/s", metrics=["tokens_per_s"]),
        wr.BarPlot(title="peak memory (GiB)", metrics=["memory_peak_gib"]),
    ]
    for key in collection.config_keys:
        if _numeric_key(collection, key):
            panels.append(wr.ScatterPlot(title=f"{name} vs {key}", x=_axis(wr, collection, key), y=wr.SummaryMetric(figure_key)))
        else:
            panels.append(
                wr.BarPlot(
                    title=f"{name} by {key}",
                    metrics=[wr.SummaryMetric(figure_key)],
                    groupby=_axis(wr, collection, key),
                    groupby_aggfunc="mean",
                )
            )
    grid = grid_keys(collection.runs, collection.config_keys)
    if len(grid) == 2:
        rows, columns = grid
        for key in (figure_key, *(key for key, _ in GRID_FIGURES)):
            panels.append(
                wr.ScatterPlot(
                    title=f"heatmap: {QUANTITIES[key].column} over {rows} x {columns}",
                    x=_axis(wr, collection, columns),
                    y=_axis(wr, collection, rows),
                    z=wr.SummaryMetric(key),
                )
            )
    return panels


def wandb_report(wr, collection: Collection, project: str, entity: str | None, title: str | None):
    """The wandb Report, built offline (``save()`` publishes it): runs grouped by the swept keys,
    with the local report's panels."""
    # each run's config has run.params: its overrides as key -> value (qwen3_trn.run.tracking); the
    # seeds of a config are one group, which wandb draws as their mean and range
    runset_kwargs = dict(project=project, groupby=[f"config.run.params.{k}" for k in collection.config_keys])
    if entity:
        runset_kwargs["entity"] = entity
    if collection.groups:
        runset_kwargs["filters"] = " or ".join(f"Group == '{g}'" for g in collection.groups)
    return wr.Report(
        project=project,
        **({"entity": entity} if entity else {}),
        title=title or collection.title,
        description=f"{len(collection.runs)} runs; swept: {', '.join(collection.swept_keys) or 'none'}",
        blocks=[wr.PanelGrid(runsets=[wr.Runset(**runset_kwargs)], panels=report_panels(wr, collection))],
    )
