"""The comparison report: matplotlib plots embedded in one HTML page, plus Markdown and CSV tables."""

from __future__ import annotations

import base64
import csv
import html
import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qwen3_trn.records import write_text_atomic
from qwen3_trn.report.runs import Collection, RunData

STATUS_COLORS = {"completed": "#1a7f37", "failed": "#cf222e", "skipped": "#9a6700"}


@dataclass
class Plot:
    id: str
    title: str
    png: bytes
    caption: str = ""


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _png(fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    _pyplot().close(fig)
    return buffer.getvalue()


def _number(value: str) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _trained(runs: list[RunData]) -> list[RunData]:
    return [r for r in runs if r.records]


def plot_loss(runs: list[RunData]) -> Plot | None:
    trained = _trained(runs)
    if not trained:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for run in trained:
        points = [(r["step"], r["loss"]) for r in run.records if "loss" in r]
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=3, label=run.label)
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title("Training loss vs step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    return Plot("loss_vs_step", "Loss vs step", _png(fig), "one line per run, from each run's per-step record")


def plot_bars(runs: list[RunData], key: str, title: str, unit: str, plot_id: str) -> Plot | None:
    rows = [(r.label, r.figures[key]) for r in _trained(runs) if r.figures.get(key) is not None]
    if not rows:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 0.5 + 0.45 * len(rows)))
    ax.barh([r[0] for r in rows], [r[1] for r in rows], color="#4c72b0")
    for i, (_, value) in enumerate(rows):
        ax.text(value, i, f" {value:,.3g}", va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(unit)
    ax.set_title(title)
    ax.grid(axis="x", alpha=0.3)
    return Plot(plot_id, title, _png(fig))


def plot_final_loss_vs(runs: list[RunData], key: str, keys: list[str]) -> Plot | None:
    """Final loss against one swept key; one series per combination of the other swept keys."""
    trained = [r for r in _trained(runs) if key in r.params and r.figures.get("last_loss") is not None]
    if not trained:
        return None
    values = list(dict.fromkeys(r.params[key] for r in trained))
    numeric = all(_number(v) is not None for v in values)
    values = sorted(values, key=_number) if numeric else values
    others = [k for k in keys if k != key]
    series: dict[str, list[tuple[Any, float]]] = {}
    for run in trained:
        name = ", ".join(f"{k}={run.params.get(k, '-')}" for k in others) or "runs"
        x = _number(run.params[key]) if numeric else values.index(run.params[key])
        series.setdefault(name, []).append((x, run.figures["last_loss"]))
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, points in series.items():
        points.sort()
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=name)
    if not numeric:
        ax.set_xticks(range(len(values)), values)
    elif len(values) <= 12:
        ax.set_xticks([_number(v) for v in values], values)
    ax.set_xlabel(key)
    ax.set_ylabel("final loss")
    ax.set_title(f"Final loss vs {key}")
    ax.grid(alpha=0.3)
    if len(series) > 1:
        ax.legend(fontsize=8, loc="best")
    return Plot(f"final_loss_vs_{key}", f"Final loss vs {key}", _png(fig))


def make_plots(collection: Collection) -> list[Plot]:
    runs = collection.runs
    plots = [
        plot_loss(runs),
        plot_bars(runs, "tokens_per_s", "Throughput (steady state, step 1 excluded)", "tokens / s", "tokens_per_s"),
        plot_bars(runs, "peak_memory_gib", "Peak memory", "GiB (max reserved)", "peak_memory"),
    ]
    if any("mfu_pct" in r.figures for r in runs):
        plots.append(plot_bars(runs, "mfu_pct", "MFU", "% of peak", "mfu"))
    plots += [plot_final_loss_vs(runs, key, collection.swept_keys) for key in collection.swept_keys]
    return [p for p in plots if p is not None]


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
        "tokens_per_s",
        "peak_memory_gib",
        "mfu_pct",
        "wall_time_s",
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
                f.get("tokens_per_s"),
                f.get("peak_memory_gib"),
                f.get("mfu_pct"),
                f.get("wall_time_s"),
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


def _md_cell(value: Any) -> str:
    return _fmt(value).replace("|", "\\|").replace("\n", " ")


def render_markdown(collection: Collection, plots: list[Plot], notes: list[str]) -> str:
    header, rows = table_rows(collection)
    shown = [i for i, name in enumerate(header) if name not in ("run_dir",)]
    counts = _counts(collection)
    lines = [f"# {collection.title}", "", _counts_line(counts, collection), ""]
    lines += [f"- {n}" for n in notes] + ([""] if notes else [])
    lines.append("| " + " | ".join(header[i] for i in shown) + " |")
    lines.append("|" + "---|" * len(shown))
    for row in rows:
        lines.append("| " + " | ".join(_md_cell(row[i]) for i in shown) + " |")
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
"""

# Sets the page title and body[data-plots-loaded] once every plot image has decoded, so a
# headless browser (and a person) can tell the plots rendered.
_SCRIPT = """
window.addEventListener('load', function () {
  var imgs = Array.prototype.slice.call(document.querySelectorAll('img.plot'));
  var ok = imgs.filter(function (img) { return img.complete && img.naturalWidth > 0; }).length;
  document.body.setAttribute('data-plots-loaded', String(ok));
  document.body.setAttribute('data-plots-total', String(imgs.length));
  document.title = document.title + ' [' + ok + '/' + imgs.length + ' plots]';
});
"""


def render_html(collection: Collection, plots: list[Plot], notes: list[str]) -> str:
    esc = html.escape
    header, rows = table_rows(collection)
    numeric = {"first_loss", "final_loss", "min_loss", "tokens_per_s", "peak_memory_gib", "mfu_pct", "wall_time_s", "steps"}
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = []
    for run, row in zip(collection.runs, rows):
        cells = []
        for name, value in zip(header, row):
            css = "num" if name in numeric else ("status-" + str(value) if name == "status" else "")
            cells.append(f'<td class="{css}">{esc(_fmt(value))}</td>')
        body.append(f'<tr data-run="{esc(run.label)}" data-status="{esc(run.status)}">{"".join(cells)}</tr>')
    figures = "\n".join(
        f'<figure id="{esc(p.id)}"><img class="plot" alt="{esc(p.title)}" src="data:image/png;base64,{base64.b64encode(p.png).decode()}">'
        f"<figcaption>{esc(p.caption or p.title)}</figcaption></figure>"
        for p in plots
    )
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
