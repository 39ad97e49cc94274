"""Comparison reports over finished runs, without any server (docs/sweeps.md).

``python -m qwen3_trn.report <sweep dir | run dirs...> [--out DIR] [--publish]`` writes
``report.html``, ``report.md`` and ``report.csv`` from each run's own record. Runs that differ
only in ``training.seed`` are seeds of one config, shown as mean and range.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from qwen3_trn.report.runs import Collection, ReportError, RunData, collect
from qwen3_trn.results.records import RunStatus, write_text_atomic

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
        if run.status == RunStatus.skipped:
            notes.append(f"skipped {run.label}: does not apply: {run.note}")
        elif run.status == RunStatus.failed:
            notes.append(f"failed {run.label}: {run.note or 'see its run directory'}")
        elif run.status == RunStatus.completed and not run.records:
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
