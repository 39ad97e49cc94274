"""The comparison report: the figures (``figures.py``) embedded in one HTML page, plus Markdown
and CSV tables."""

from __future__ import annotations

import base64
import csv
import html
import io
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from qwen3_trn.config.overrides import SEED_KEY
from qwen3_trn.report.figures import HeatmapCell, Plot
from qwen3_trn.report.figures import make_plots as _make_plots
from qwen3_trn.report.runs import Collection, RunData
from qwen3_trn.report.seeds import MARKS_LEGEND, marks
from qwen3_trn.results.quantities import QUANTITIES, REPORTED
from qwen3_trn.results.records import write_text_atomic

# Columns shown with a short form in HTML and Markdown (the CSV keeps the full value).
SHORT = {"validation_tokens_sha256": 12}
# The figures of the tables, in their order (their names, units and formats: QUANTITIES).
TABLE_FIGURES = ("val_loss", "val_perplexity", "last_loss", "tokens_per_s", "peak_memory_gib", "mfu_pct", "wall_time_s")
# The table of configs leaves out what another of its figures says (perplexity: exp of the loss).
CONFIG_FIGURES = tuple(k for k in TABLE_FIGURES if k != "val_perplexity")
# A run's bookkeeping: in the table of runs and the CSV, not in the table of configs.
BOOKKEEPING = ("validation_tokens_sha256", "source", "wandb_run_id", "run_dir", "note")
# The CSV's figure columns (a run's raw values) and the figure each one is.
CSV_FIGURES = {QUANTITIES[key].csv or key: key for key in REPORTED}


def make_plots(collection: Collection) -> list[Plot]:
    return _make_plots(collection)


# ------------------------------------------------------------------------------------------
# Tables
# ------------------------------------------------------------------------------------------


def seeds_line(collection: Collection) -> str:
    """What the seeds are and how the figures treat them; says so when there is one per config."""
    seeds = sorted({r.seed for r in collection.runs if r.records and r.seed is not None})
    named = f"{SEED_KEY} {', '.join(map(str, seeds))}" if seeds else "the configured seed"
    n = collection.seeds_per_config
    if n > 1:
        return (
            f"Each config ran with {n} seeds ({named}): every figure and table shows the mean over the seeds and their "
            f"range (min–max). {MARKS_LEGEND}."
        )
    if len([c for c in collection.configs if c.trained]) > 1:
        return (
            f"Each config ran with one seed ({named}): there is no seed spread, so a difference between configs may be "
            "seed noise. Add sweep.seeds=N to run each config with N seeds."
        )
    return f"One config, {len([r for r in collection.runs if r.records])} trained run(s) ({named})."


def _available(collection: Collection) -> list[str]:
    return [k for k in TABLE_FIGURES if any(r.figures.get(k) is not None for r in collection.runs)]


def _status_counts(runs: list[RunData]) -> str:
    counts: dict[str, int] = {}
    for run in runs:
        counts[run.status] = counts.get(run.status, 0) + 1
    return ", ".join(f"{n} {status}" for status, n in counts.items())


def config_rows(collection: Collection) -> tuple[list[str], list[list[str]]]:
    """The table of configs, named by their swept values: each figure as its seeds' mean
    (min–max), marked against the best."""
    figures = [k for k in _available(collection) if k in CONFIG_FIGURES]
    configs = collection.configs
    marked = {key: marks(QUANTITIES[key], {c.label: s for c in configs if (s := c.spread(key)) is not None}) for key in figures}
    named = collection.config_keys or ["config"]
    header = [*named, "seeds", "runs", *(QUANTITIES[k].column for k in figures)]
    rows = []
    for config in configs:
        cells = []
        for key in figures:
            s = config.spread(key)
            mark = marked[key].get(config.label, "")
            cells.append("" if s is None else f"{s.text(QUANTITIES[key])} {mark}".strip())
        seeds = config.seeds
        rows.append(
            [
                *([config.params.get(k, "") for k in collection.config_keys] or [config.label]),
                ", ".join(map(str, seeds)),
                _status_counts(config.runs),
                *cells,
            ]
        )
    return header, rows


def _relative(path: Path | None, collection: Collection) -> str:
    if path is None:
        return ""
    for sweep_dir in collection.sweep_dirs:
        try:
            return str(path.resolve().relative_to(sweep_dir.resolve()))
        except ValueError:
            continue
    return str(path)


def run_rows(collection: Collection) -> tuple[list[str], list[list[str]]]:
    """The table of runs (one per seed), each figure as written, with each run's bookkeeping."""
    figures = _available(collection)
    header = [
        "run",
        "job",
        "seed",
        "status",
        *(QUANTITIES[k].column for k in figures),
        "validation tokens",
        "source",
        "wandb run",
        "run dir",
        "note",
    ]
    rows = []
    for run in collection.runs:
        sha = run.figures.get("validation_tokens_sha256") or ""
        rows.append(
            [
                run.label,
                "" if run.num is None else str(run.num),
                "" if run.seed is None else str(run.seed),
                run.status,
                *(QUANTITIES[k].format(run.figures.get(k)) for k in figures),
                sha[: SHORT["validation_tokens_sha256"]],
                run.source,
                run.wandb_run_id or "",
                _relative(run.run_dir, collection),
                run.note,
            ]
        )
    return header, rows


def table_rows(collection: Collection) -> tuple[list[str], list[list[Any]]]:
    """The CSV: one row per run, every figure at full precision and the run's bookkeeping."""
    header = ["run", "job", "status", *collection.swept_keys, "seed", "mode", *CSV_FIGURES, *BOOKKEEPING]
    rows = []
    for run in collection.runs:
        f = run.figures
        rows.append(
            [
                run.label,
                run.num if run.num is not None else "",
                run.status,
                *(run.params.get(k, "") for k in collection.swept_keys),
                "" if run.seed is None else run.seed,
                run.backend or run.params.get("backend", ""),
                *(f.get(key) for key in CSV_FIGURES.values()),
                f.get("validation_tokens_sha256"),
                run.source,
                run.wandb_run_id or "",
                str(run.run_dir or ""),
                run.note,
            ]
        )
    return header, rows


def write_csv(path: Path, collection: Collection) -> None:
    header, rows = table_rows(collection)
    handle = io.StringIO(newline="")
    writer = csv.writer(handle)
    writer.writerow(header)
    writer.writerows([["" if v is None else v for v in row] for row in rows])
    write_text_atomic(path, handle.getvalue())


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _cell_text(cell: HeatmapCell, quantity_key: str) -> str:
    quantity = QUANTITIES[quantity_key]
    spread = f" ({quantity.format(cell.low)}–{quantity.format(cell.high)})" if cell.low is not None else ""
    return f"{cell.text}{spread} {cell.mark}".strip()


def _markdown_grid(plot: Plot) -> list[str]:
    """A heatmap as a Markdown table: rows and columns of the two swept keys, values in the cells."""
    (row_key, rows), (column_key, columns) = plot.rows, plot.columns
    values = {(c.row, c.column): _cell_text(c, plot.figure) for c in plot.cells}
    lines = [
        f"**{plot.title}** (rows: {row_key}, columns: {column_key})",
        "",
        "| " + " | ".join([_md_cell(f"{row_key} \\ {column_key}"), *map(_md_cell, columns)]) + " |",
        "|" + "---|" * (len(columns) + 1),
    ]
    for i, row in enumerate(rows):
        lines.append("| " + " | ".join([_md_cell(row), *(values.get((i, j), "n/a") for j in range(len(columns)))]) + " |")
    return lines + [""]


def _markdown_table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(map(_md_cell, header)) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(_md_cell(str(c)) for c in row) + " |" for row in rows]


def render_markdown(collection: Collection, plots: list[Plot], notes: list[str]) -> str:
    counts = _counts(collection)
    lines = [f"# {collection.title}", ""]
    if collection.subtitle:
        lines += [collection.subtitle, ""]
    lines += [_counts_line(counts, collection), "", seeds_line(collection), ""]
    lines += [f"- {n}" for n in notes] + ([""] if notes else [])
    for plot in plots:
        if plot.cells:
            lines += _markdown_grid(plot)
    lines += ["## Configs", "", *_markdown_table(*config_rows(collection)), ""]
    lines += ["## Runs", "", *_markdown_table(*run_rows(collection)), ""]
    lines += ["Plots: " + ", ".join(p.title for p in plots) + " (in report.html)." if plots else "No trained run to plot.", ""]
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
th { background: #f6f8fa; } td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
#where, #seeds { color: #57606a; } .scroll { overflow-x: auto; } details summary { cursor: pointer; margin: 1em 0 0.5em; }
.status-completed td:nth-child(4) { color: #1a7f37; } .status-failed td:nth-child(4) { color: #cf222e; font-weight: bold; } .status-died td:nth-child(4) { color: #cf222e; font-weight: bold; } .status-skipped td:nth-child(4) { color: #9a6700; }
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
        cells = json.dumps([asdict(c) for c in plot.cells])
        return f'<figure id="{esc(plot.id)}" class="heatmap" data-cells="{esc(cells)}">{plot.svg}{caption}</figure>'
    src = f"data:image/png;base64,{base64.b64encode(plot.png).decode()}"
    return f'<figure id="{esc(plot.id)}"><img class="plot" alt="{esc(plot.title)}" src="{src}">{caption}</figure>'


# Columns right-aligned as numbers: every figure's, and a run's job and seed.
_NUMERIC_COLUMNS = {*(QUANTITIES[k].column for k in TABLE_FIGURES), "job", "seed"}


def _html_table(table_id: str, table: tuple[list[str], list[list[str]]], row_attrs: list[str]) -> str:
    esc = html.escape
    header, rows = table
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    classes = ["num" if h in _NUMERIC_COLUMNS else "" for h in header]
    body = [
        f"<tr {attrs}>" + "".join(f'<td class="{css}">{esc(str(value))}</td>' for css, value in zip(classes, row)) + "</tr>"
        for attrs, row in zip(row_attrs, rows)
    ]
    return (
        f'<div class="scroll"><table id="{table_id}"><thead><tr>{head}</tr></thead>\n<tbody>\n{chr(10).join(body)}\n</tbody></table></div>'
    )


def render_html(collection: Collection, plots: list[Plot], notes: list[str]) -> str:
    esc = html.escape
    configs_table = _html_table(
        "configs", config_rows(collection), [f'data-config="{esc(c.label)}" data-seeds="{len(c.trained)}"' for c in collection.configs]
    )
    runs_table = _html_table(
        "runs",
        run_rows(collection),
        [f'data-run="{esc(r.label)}" data-status="{esc(r.status)}" class="status-{esc(r.status)}"' for r in collection.runs],
    )
    figures = "\n".join(_figure_html(p) for p in plots)
    notes_html = "".join(f"<li>{esc(n)}</li>" for n in notes)
    subtitle = f'<p id="where">{esc(collection.subtitle)}</p>' if collection.subtitle else ""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{esc(collection.title)}</title><style>{_CSS}</style></head>
<body>
<h1>{esc(collection.title)}</h1>
{subtitle}
<p id="counts">{esc(_counts_line(_counts(collection), collection))}</p>
<p id="seeds">{esc(seeds_line(collection))}</p>
{f'<ul class="notes">{notes_html}</ul>' if notes else ""}
<section id="plots">
{figures or "<p>No trained run to plot.</p>"}
</section>
<h2>Configs</h2>
{configs_table}
<details id="run-details"><summary>Runs (one per seed) and their records</summary>
{runs_table}
</details>
<script>{_SCRIPT}</script>
</body></html>
"""
