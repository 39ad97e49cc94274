"""The comparison report: the figures (``figures.py``) embedded in one HTML page, plus Markdown
and CSV tables."""

from __future__ import annotations

import base64
import csv
import html
import io
import json
import math
from pathlib import Path
from typing import Any

from qwen3_trn.records import write_text_atomic
from qwen3_trn.report.figures import Plot
from qwen3_trn.report.figures import make_plots as _make_plots
from qwen3_trn.report.runs import Collection

# Columns shown with a short form in HTML and Markdown (the CSV keeps the full value).
SHORT = {"validation_tokens_sha256": 12}


def make_plots(collection: Collection) -> list[Plot]:
    return _make_plots(collection.runs, collection.swept_keys)


# ------------------------------------------------------------------------------------------
# Tables
# ------------------------------------------------------------------------------------------


def _fmt(value: Any, digits: int = 4) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        if math.isnan(value):
            return ""
        return f"{value:,.{digits}f}" if abs(value) < 1e4 else f"{value:,.0f}"
    return str(value)


def table_rows(collection: Collection) -> tuple[list[str], list[list[Any]]]:
    header = [
        "run",
        "job",
        "status",
        *collection.swept_keys,
        "mode",
        "steps",
        "first_loss",
        "final_loss",
        "min_loss",
        "val_loss",
        "val_perplexity",
        "tokens_per_s",
        "peak_memory_gib",
        "mfu_pct",
        "wall_time_s",
        "validation_tokens_sha256",
        "source",
        "wandb_run_id",
        "run_dir",
        "note",
    ]
    rows = []
    for run in collection.runs:
        f = run.figures
        rows.append(
            [
                run.label,
                run.num if run.num is not None else "",
                run.status,
                *(run.params.get(k, "") for k in collection.swept_keys),
                run.backend or run.params.get("backend", ""),
                f.get("steps_logged", ""),
                f.get("first_loss"),
                f.get("last_loss"),
                f.get("min_loss"),
                f.get("val_loss"),
                f.get("val_perplexity"),
                f.get("tokens_per_s"),
                f.get("peak_memory_gib"),
                f.get("mfu_pct"),
                f.get("wall_time_s"),
                f.get("validation_tokens_sha256"),
                run.source,
                run.wandb_run_id or "",
                str(run.run_dir or ""),
                run.note,
            ]
        )
    return header, rows


def _shown(name: str, value: Any) -> str:
    text = _fmt(value)
    return text[: SHORT[name]] if name in SHORT else text


def write_csv(path: Path, collection: Collection) -> None:
    header, rows = table_rows(collection)
    handle = io.StringIO(newline="")
    writer = csv.writer(handle)
    writer.writerow(header)
    writer.writerows([["" if v is None else v for v in row] for row in rows])
    write_text_atomic(path, handle.getvalue())


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _markdown_grid(plot: Plot) -> list[str]:
    """A heatmap as a Markdown table: rows and columns of the two swept keys, values in the cells."""
    (row_key, rows), (column_key, columns) = plot.rows, plot.columns
    values = {(c.row, c.column): c.text for c in plot.cells}
    lines = [
        f"**{plot.title}** (rows: {row_key}, columns: {column_key})",
        "",
        "| " + " | ".join([_md_cell(f"{row_key} \\ {column_key}"), *map(_md_cell, columns)]) + " |",
        "|" + "---|" * (len(columns) + 1),
    ]
    for i, row in enumerate(rows):
        lines.append("| " + " | ".join([_md_cell(row), *(values.get((i, j), "n/a") for j in range(len(columns)))]) + " |")
    return lines + [""]


def render_markdown(collection: Collection, plots: list[Plot], notes: list[str]) -> str:
    header, rows = table_rows(collection)
    shown = [i for i, name in enumerate(header) if name not in ("run_dir",)]
    counts = _counts(collection)
    lines = [f"# {collection.title}", "", _counts_line(counts, collection), ""]
    lines += [f"- {n}" for n in notes] + ([""] if notes else [])
    for plot in plots:
        if plot.cells:
            lines += _markdown_grid(plot)
    lines.append("| " + " | ".join(header[i] for i in shown) + " |")
    lines.append("|" + "---|" * len(shown))
    for row in rows:
        lines.append("| " + " | ".join(_md_cell(_shown(header[i], row[i])) for i in shown) + " |")
    lines += ["", "Plots: " + ", ".join(p.title for p in plots) + " (in report.html)." if plots else "No trained run to plot.", ""]
    return "\n".join(lines)


def _counts(collection: Collection) -> dict[str, int]:
    counts: dict[str, int] = {}
    for run in collection.runs:
        counts[run.status] = counts.get(run.status, 0) + 1
    return counts


def _counts_line(counts: dict[str, int], collection: Collection) -> str:
    parts = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
    swept = ", ".join(collection.swept_keys) or "none"
    groups = f"; wandb group {', '.join(collection.groups)}" if collection.groups else ""
    return f"{len(collection.runs)} runs: {parts}. Swept keys: {swept}{groups}."


_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #1f2328; }
h1 { font-size: 1.4em; } figure { display: inline-block; margin: 0 1em 1.5em 0; vertical-align: top; }
figure img { max-width: 100%; border: 1px solid #d0d7de; } figcaption { font-size: 0.85em; color: #57606a; }
table { border-collapse: collapse; font-size: 0.85em; } th, td { border: 1px solid #d0d7de; padding: 4px 8px; text-align: left; }
th { background: #f6f8fa; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.status-completed { color: #1a7f37; } .status-failed { color: #cf222e; font-weight: bold; } .status-skipped { color: #9a6700; }
.notes li { margin-bottom: 0.3em; }
figure.heatmap svg { max-width: 100%; height: auto; border: 1px solid #d0d7de; }
"""

# Once the page has loaded: body[data-plots-loaded] counts the plot images that decoded, and
# each heatmap's data-cells-drawn the cells the browser laid out with a size and a fill, so a
# headless browser (and a person) can tell the figures rendered.
_SCRIPT = """
window.addEventListener('load', function () {
  var imgs = Array.prototype.slice.call(document.querySelectorAll('img.plot'));
  var ok = imgs.filter(function (img) { return img.complete && img.naturalWidth > 0; }).length;
  document.body.setAttribute('data-plots-loaded', String(ok));
  document.body.setAttribute('data-plots-total', String(imgs.length));
  var drawn = 0;
  document.querySelectorAll('figure.heatmap').forEach(function (fig) {
    var cells = Array.prototype.slice.call(fig.querySelectorAll('[id^="' + fig.id + '-cell-"]'));
    var shown = cells.filter(function (cell) {
      var box = cell.getBoundingClientRect();
      var path = cell.querySelector('path') || cell;
      var fill = window.getComputedStyle(path).fill;
      return box.width > 4 && box.height > 4 && fill && fill !== 'none';
    }).length;
    fig.setAttribute('data-cells-drawn', String(shown));
    drawn += shown;
  });
  document.body.setAttribute('data-heatmap-cells-drawn', String(drawn));
  document.title = document.title + ' [' + ok + '/' + imgs.length + ' plots]';
});
"""


def _figure_html(plot: Plot) -> str:
    esc = html.escape
    caption = f"<figcaption>{esc(plot.caption or plot.title)}</figcaption>"
    if plot.svg is not None:
        cells = json.dumps([{"row": c.row, "column": c.column, "value": c.value, "text": c.text, "color": c.color} for c in plot.cells])
        return f'<figure id="{esc(plot.id)}" class="heatmap" data-cells="{esc(cells)}">{plot.svg}{caption}</figure>'
    src = f"data:image/png;base64,{base64.b64encode(plot.png).decode()}"
    return f'<figure id="{esc(plot.id)}"><img class="plot" alt="{esc(plot.title)}" src="{src}">{caption}</figure>'


def render_html(collection: Collection, plots: list[Plot], notes: list[str]) -> str:
    esc = html.escape
    header, rows = table_rows(collection)
    numeric = {
        "first_loss",
        "final_loss",
        "min_loss",
        "val_loss",
        "val_perplexity",
        "tokens_per_s",
        "peak_memory_gib",
        "mfu_pct",
        "wall_time_s",
        "steps",
    }
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = []
    for run, row in zip(collection.runs, rows):
        cells = []
        for name, value in zip(header, row):
            css = "num" if name in numeric else ("status-" + str(value) if name == "status" else "")
            cells.append(f'<td class="{css}">{esc(_shown(name, value))}</td>')
        body.append(f'<tr data-run="{esc(run.label)}" data-status="{esc(run.status)}">{"".join(cells)}</tr>')
    figures = "\n".join(_figure_html(p) for p in plots)
    notes_html = "".join(f"<li>{esc(n)}</li>" for n in notes)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{esc(collection.title)}</title><style>{_CSS}</style></head>
<body>
<h1>{esc(collection.title)}</h1>
<p id="counts">{esc(_counts_line(_counts(collection), collection))}</p>
{f'<ul class="notes">{notes_html}</ul>' if notes else ""}
<section id="plots">
{figures or "<p>No trained run to plot.</p>"}
</section>
<h2>Runs</h2>
<table id="runs"><thead><tr>{head}</tr></thead>
<tbody>
{chr(10).join(body)}
</tbody></table>
<script>{_SCRIPT}</script>
</body></html>
"""
