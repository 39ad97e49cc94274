"""The report's figures, drawn with matplotlib from each run's per-step record and summary.

* loss vs step: training loss as a line and validation loss as dashed markers, per run;
* throughput, peak memory, MFU: one bar per run;
* the final loss against each swept key: bars per value of a categorical key (no line through
  categories), lines against the value of a numeric key, one series per combination of the
  other swept keys;
* for exactly two swept keys, heatmaps of the final validation loss, tokens/s and peak memory
  over the grid, with the value printed in each cell. Heatmaps are SVG, each cell an element
  with id ``<figure id>-cell-<row>-<column>``, so a browser (and a test) can find every cell.

"Final loss" is the held-out loss of the last validation when every run has one, else the
training loss of the last step; titles and axes say which.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass, field
from typing import Any

from qwen3_trn.report.runs import RunData

BAR_COLOR = "#4c72b0"


@dataclass
class HeatmapCell:
    row: int
    column: int
    value: float
    text: str
    color: str


@dataclass
class Plot:
    id: str
    title: str
    png: bytes | None = None
    svg: str | None = None
    caption: str = ""
    # heatmaps: the grid (row / column keys and values) and its drawn cells
    rows: tuple[str, list[str]] | None = None
    columns: tuple[str, list[str]] | None = None
    cells: list[HeatmapCell] = field(default_factory=list)


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


def _svg(fig, prefix: str) -> str:
    """Inline SVG: text kept as text, element ids from the artists' gids, and every other id
    (and reference to it) prefixed, so that several SVGs share one HTML page."""
    plt = _pyplot()
    buffer = io.StringIO()
    with plt.rc_context({"svg.fonttype": "none", "svg.hashsalt": prefix}):
        fig.savefig(buffer, format="svg", bbox_inches="tight")
    plt.close(fig)
    text = buffer.getvalue()
    text = text[text.index("<svg") :]
    own = f"{prefix}-"
    text = re.sub(r'\bid="(?!' + re.escape(own) + r')([^"]+)"', lambda m: f'id="{own}{m.group(1)}"', text)
    return re.sub(r'(url\(#|href="#)(?!' + re.escape(own) + r')([^")]+)', lambda m: f"{m.group(1)}{own}{m.group(2)}", text)


def number(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def ordered_values(values: list[str]) -> tuple[list[str], bool]:
    """The distinct values in order (numeric ones sorted by value), and whether all are numeric."""
    distinct = list(dict.fromkeys(values))
    numeric = all(number(v) is not None for v in distinct)
    return (sorted(distinct, key=number) if numeric else distinct), numeric


def trained(runs: list[RunData]) -> list[RunData]:
    return [r for r in runs if r.records]


def final_loss_key(runs: list[RunData]) -> tuple[str, str]:
    """(figure key, name): the final validation loss when every trained run has one, else training loss."""
    done = trained(runs)
    if done and all(r.figures.get("val_loss") is not None for r in done):
        return "val_loss", "final validation loss"
    return "last_loss", "final training loss"


def plot_loss(runs: list[RunData]) -> Plot | None:
    done = trained(runs)
    if not done:
        return None
    from matplotlib.ticker import MaxNLocator

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    any_val = False
    for index, run in enumerate(done):
        color = f"C{index % 10}"
        train = [(r["step"], r["loss"]) for r in run.records if "loss" in r]
        held_out = [(r["step"], r["val_loss"]) for r in run.records if "val_loss" in r]
        ax.plot(
            [p[0] for p in train],
            [p[1] for p in train],
            color=color,
            marker="o",
            markersize=2.5,
            linewidth=1.2,
            label=f"{run.label} (train)",
        )
        if held_out:
            any_val = True
            ax.plot(
                [p[0] for p in held_out],
                [p[1] for p in held_out],
                color=color,
                marker="D",
                markersize=5,
                linestyle="--",
                linewidth=1.5,
                label=f"{run.label} (validation)",
            )
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title("Training and validation loss vs step" if any_val else "Training loss vs step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    caption = (
        "solid: training loss of each step; dashed diamonds: held-out validation loss"
        if any_val
        else "one line per run, from each run's per-step record"
    )
    return Plot("loss_vs_step", "Loss vs step", png=_png(fig), caption=caption)


def plot_bars(runs: list[RunData], key: str, title: str, unit: str, plot_id: str) -> Plot | None:
    rows = [(r.label, r.figures[key]) for r in trained(runs) if r.figures.get(key) is not None]
    if not rows:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 0.5 + 0.45 * len(rows)))
    ax.barh([r[0] for r in rows], [r[1] for r in rows], color=BAR_COLOR)
    for i, (_, value) in enumerate(rows):
        ax.text(value, i, f" {value:,.3g}", va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(unit)
    ax.set_title(title)
    ax.grid(axis="x", alpha=0.3)
    return Plot(plot_id, title, png=_png(fig))


def _series(runs: list[RunData], key: str, keys: list[str]) -> dict[str, list[RunData]]:
    """Runs grouped by the values of the swept keys other than ``key``."""
    others = [k for k in keys if k != key]
    series: dict[str, list[RunData]] = {}
    for run in runs:
        name = ", ".join(f"{k}={run.params.get(k, '-')}" for k in others) or "runs"
        series.setdefault(name, []).append(run)
    return series


def plot_final_vs(runs: list[RunData], key: str, keys: list[str]) -> Plot | None:
    """The final loss against one swept key: lines for a numeric key, grouped bars for a categorical one."""
    figure_key, name = final_loss_key(runs)
    done = [r for r in trained(runs) if key in r.params and r.figures.get(figure_key) is not None]
    if not done:
        return None
    values, numeric = ordered_values([r.params[key] for r in done])
    series = _series(done, key, keys)
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    if numeric:
        for label, members in series.items():
            points = sorted((number(r.params[key]), r.figures[figure_key]) for r in members)
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
        if len(values) <= 12:
            ax.set_xticks([number(v) for v in values], values)
    else:
        width = 0.8 / len(series)
        for s, (label, members) in enumerate(series.items()):
            for run in members:
                x = values.index(run.params[key]) - 0.4 + width * (s + 0.5)
                value = run.figures[figure_key]
                ax.bar(x, value, width=width * 0.92, color=f"C{s % 10}", label=label if run is members[0] else None)
                ax.text(x, value, f"{value:.3f}", ha="center", va="bottom", fontsize=7)
        ax.set_xticks(range(len(values)), values)
        low = min(r.figures[figure_key] for r in done)
        high = max(r.figures[figure_key] for r in done)
        ax.set_ylim(low - 0.1 * (high - low + 1e-9) - 0.05 * abs(low), high + 0.15 * (high - low + 1e-9) + 0.01 * abs(high))
    ax.set_xlabel(key)
    ax.set_ylabel(name)
    ax.set_title(f"{name[0].upper() + name[1:]} vs {key}")
    ax.grid(alpha=0.3, axis="y" if not numeric else "both")
    if len(series) > 1:
        ax.legend(fontsize=8, loc="best")
    kind = "lines against the value" if numeric else "one bar per value"
    return Plot(f"final_loss_vs_{key}", f"Final loss vs {key}", png=_png(fig), caption=f"{name} of each run; {kind}")


def plot_heatmap(
    runs: list[RunData], keys: list[str], figure_key: str, title: str, fmt: str, plot_id: str, cmap: str = "viridis"
) -> Plot | None:
    """``figure_key`` over the grid of two swept keys (rows: the first, columns: the second)."""
    row_key, column_key = keys
    done = [r for r in trained(runs) if r.figures.get(figure_key) is not None and row_key in r.params and column_key in r.params]
    if not done:
        return None
    rows, _ = ordered_values([r.params[row_key] for r in done])
    columns, _ = ordered_values([r.params[column_key] for r in done])
    grid: dict[tuple[str, str], float] = {}
    for run in done:
        grid.setdefault((run.params[row_key], run.params[column_key]), float(run.figures[figure_key]))
    import matplotlib
    from matplotlib.colors import Normalize
    from matplotlib.patches import Rectangle

    plt = _pyplot()
    values = list(grid.values())
    norm = Normalize(vmin=min(values), vmax=max(values) if max(values) > min(values) else min(values) + 1e-9)
    colormap = matplotlib.colormaps[cmap]
    fig, ax = plt.subplots(figsize=(1.6 + 1.3 * len(columns), 1.2 + 0.9 * len(rows)))
    cells = []
    for i, row in enumerate(rows):
        for j, column in enumerate(columns):
            value = grid.get((row, column))
            if value is None:
                ax.add_patch(Rectangle((j, i), 1, 1, facecolor="#eeeeee", edgecolor="white", hatch="//"))
                ax.text(j + 0.5, i + 0.5, "n/a", ha="center", va="center", fontsize=9, color="#888888")
                continue
            rgba = colormap(norm(value))
            color = matplotlib.colors.to_hex(rgba)
            ax.add_patch(Rectangle((j, i), 1, 1, facecolor=color, edgecolor="white", linewidth=2, gid=f"{plot_id}-cell-{i}-{j}"))
            text = format(value, fmt)
            luminance = 0.2126 * rgba[0] + 0.7152 * rgba[1] + 0.0722 * rgba[2]
            ax.text(
                j + 0.5,
                i + 0.5,
                text,
                ha="center",
                va="center",
                fontsize=11,
                fontweight="bold",
                color="black" if luminance > 0.5 else "white",
                gid=f"{plot_id}-value-{i}-{j}",
            )
            cells.append(HeatmapCell(i, j, value, text, color))
    ax.set_xlim(0, len(columns))
    ax.set_ylim(len(rows), 0)
    ax.set_xticks([j + 0.5 for j in range(len(columns))], columns)
    ax.set_yticks([i + 0.5 for i in range(len(rows))], rows)
    ax.set_xlabel(column_key)
    ax.set_ylabel(row_key)
    ax.set_title(title)
    ax.tick_params(length=0)
    for spine in ax.spines.values():
        spine.set_visible(False)
    fig.colorbar(matplotlib.cm.ScalarMappable(norm=norm, cmap=colormap), ax=ax, fraction=0.05, pad=0.04)
    return Plot(
        plot_id,
        title,
        svg=_svg(fig, plot_id),
        caption=f"{title} for each {row_key} x {column_key}",
        rows=(row_key, rows),
        columns=(column_key, columns),
        cells=cells,
    )


def grid_keys(runs: list[RunData], swept_keys: list[str]) -> list[str]:
    """The swept keys whose values differ between the trained runs (a skipped job does not count)."""
    done = trained(runs)
    return [k for k in swept_keys if len({r.params.get(k) for r in done}) > 1]


def heatmaps(runs: list[RunData], swept_keys: list[str]) -> list[Plot]:
    """For two swept keys: final validation (else training) loss, tokens/s and peak memory."""
    keys = grid_keys(runs, swept_keys)
    if len(keys) != 2:
        return []
    figure_key, name = final_loss_key(runs)
    specs = [
        (figure_key, name[0].upper() + name[1:], ".4f", "heatmap_val_loss" if figure_key == "val_loss" else "heatmap_loss", "viridis_r"),
        ("tokens_per_s", "Throughput (tokens/s)", ",.0f", "heatmap_tokens_per_s", "viridis"),
        ("peak_memory_gib", "Peak memory (GiB)", ".3f", "heatmap_peak_memory", "viridis_r"),
    ]
    plots = [plot_heatmap(runs, keys, key, title, fmt, plot_id, cmap) for key, title, fmt, plot_id, cmap in specs]
    return [p for p in plots if p is not None]


def make_plots(runs: list[RunData], swept_keys: list[str]) -> list[Plot]:
    plots = heatmaps(runs, swept_keys) + [
        plot_loss(runs),
        plot_bars(runs, "tokens_per_s", "Throughput (steady state, step 1 excluded)", "tokens / s", "tokens_per_s"),
        plot_bars(runs, "peak_memory_gib", "Peak memory", "GiB (max reserved)", "peak_memory"),
    ]
    if any("mfu_pct" in r.figures for r in runs):
        plots.append(plot_bars(runs, "mfu_pct", "MFU", "% of peak", "mfu"))
    plots += [plot_final_vs(runs, key, swept_keys) for key in swept_keys]
    return [p for p in plots if p is not None]
