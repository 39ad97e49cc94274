"""Comparison reports over finished runs, without any server.

``python -m qwen3_trn.report <sweep dir | run dirs...> [--out DIR] [--publish]`` writes
``report.html`` (figures embedded: train and validation loss vs step, tokens/s, peak memory,
MFU; the final loss against each swept key: points per value of a categorical key, lines
against a numeric one; for two swept keys, heatmaps of final validation loss, tokens/s and peak
memory with the values in the cells), ``report.md`` (a table of configs and one of runs) and
``report.csv`` (one row per run, failed and skipped jobs of a sweep included). Runs are read
from their own record (``metrics.jsonl`` and ``summary.json``; ``overrides.yaml`` and the sweep's
manifest say what was swept). The swept keys are the overrides whose values differ between
runs; runs that differ only in ``training.seed`` are seeds of one config, shown as their mean
and range (min–max) in every figure and table, with marks for the configs that differ from the
best beyond that range (``seeds.py``; every figure's name, unit, better direction and format:
``qwen3_trn.quantities``). ``--publish`` also tries to publish a wandb Report with the same panels (``publish.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from qwen3_trn.records import write_text_atomic
from qwen3_trn.report.runs import Collection, ReportError, RunData, collect

__all__ = ["build_report", "Collection", "ReportError", "ReportResult", "RunData", "collect"]


@dataclass
class ReportResult:
    html: Path
    markdown: Path
    csv: Path
    collection: Collection
    notes: list[str] = field(default_factory=list)
    published: bool = False


def _notes(collection: Collection) -> list[str]:
    notes = []
    for run in collection.runs:
        if run.status == "skipped":
            notes.append(f"skipped {run.label}: does not apply: {run.note}")
        elif run.status == "failed":
            notes.append(f"failed {run.label}: {run.note or 'see its run directory'}")
        elif run.status == "completed" and not run.records:
            notes.append(f"{run.label}: no per-step metrics found (no metrics.jsonl)")
    digests = {run.figures.get("validation_tokens_sha256") for run in collection.runs if "val_loss" in run.figures}
    if len(digests) > 1:
        notes.append(
            "the runs evaluated different validation tokens (validation_tokens_sha256 differs), so their val_loss "
            "are not on the same text; set validation.seq_len and validation.local_batch_size to compare them"
        )
    return notes


def build_report(
    paths: list[Path | str], out_dir: Path | str | None = None, publish: bool = False, title: str | None = None
) -> ReportResult:
    from qwen3_trn.report.render import make_plots, render_html, render_markdown, write_csv

    collection = collect([Path(p) for p in paths])
    if title:
        collection.title = title
    out = Path(out_dir) if out_dir else (Path(paths[0]) if len(paths) == 1 and Path(paths[0]).is_dir() else Path("."))
    out.mkdir(parents=True, exist_ok=True)
    notes = _notes(collection)
    published = False
    if publish:
        from qwen3_trn.report.publish import publish_report

        published, line = publish_report(collection, title)
        notes.append(line)
    plots = make_plots(collection)
    result = ReportResult(
        html=out / "report.html",
        markdown=out / "report.md",
        csv=out / "report.csv",
        collection=collection,
        notes=notes,
        published=published,
    )
    write_text_atomic(result.html, render_html(collection, plots, notes))
    write_text_atomic(result.markdown, render_markdown(collection, plots, notes))
    write_csv(result.csv, collection)
    return result
