"""Optionally publish a wandb Report (wandb-workspaces) for the same runs, grouped by the swept keys.

Needs the ``wandb-workspaces`` package (not a dependency), an API key (``WANDB_API_KEY`` or
``wandb login``) and the network. Offline runs are uploaded first with ``wandb sync``. Anything
missing is said in one line; the local report is written either way.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from qwen3_trn.report.runs import Collection
from qwen3_trn.report.wandb_offline import find_run_files, read_offline_run
from qwen3_trn.tracking import wandb_api_key


def _offline_dirs(collection: Collection) -> list[Path]:
    dirs = []
    for run in collection.runs:
        if run.run_dir is not None:
            dirs += [f.parent for f in find_run_files(run.run_dir) if f.parent.name.startswith("offline-run-")]
    return dirs


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
        files = find_run_files(run.run_dir) if run.run_dir else []
        if files:
            offline = read_offline_run(files[-1])
            project, entity = offline.project or project, offline.entity or entity
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


def wandb_report(wr, collection: Collection, project: str, entity: str | None, title: str | None):
    """The wandb Report object (built offline; ``save()`` publishes it): the runs grouped by the
    swept keys, with loss, throughput and memory panels and final loss vs each swept key."""
    # each run's config has run.params: its overrides as key -> value (qwen3_trn.tracking)
    runset_kwargs = dict(project=project, groupby=[f"config.run.params.{k}" for k in collection.swept_keys])
    if entity:
        runset_kwargs["entity"] = entity
    if collection.groups:
        runset_kwargs["filters"] = " or ".join(f"Group == '{g}'" for g in collection.groups)
    panels = [
        wr.LinePlot(title="loss", x="Step", y=["loss"]),
        wr.LinePlot(title="tokens/s", x="Step", y=["tokens_per_s"]),
        wr.BarPlot(title="peak memory (GiB)", metrics=["memory_peak_gib"]),
    ] + [wr.ScatterPlot(title=f"final loss vs {k}", x=f"config.run.params.{k}", y="summary.last_loss") for k in collection.swept_keys]
    return wr.Report(
        project=project,
        **({"entity": entity} if entity else {}),
        title=title or collection.title,
        description=f"{len(collection.runs)} runs; swept: {', '.join(collection.swept_keys) or 'none'}",
        blocks=[wr.PanelGrid(runsets=[wr.Runset(**runset_kwargs)], panels=panels)],
    )
