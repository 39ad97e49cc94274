"""The report's figures, drawn with matplotlib over the collection's configs, each the mean of
its seeds with their range: loss vs step, per-config bars (throughput, peak memory, MFU), the
final loss against each swept key, and for two swept keys SVG heatmaps whose cells have ids
``<figure id>-cell-<row>-<column>``. Numbers are written as ``qwen3_trn.results.quantities`` says.

"Final loss" is the last validation's loss when every run has one, else the last training loss.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass, field
from typing import Any

from qwen3_trn.report.runs import Collection, ConfigRuns, RunData
from qwen3_trn.report.seeds import BEST_MARK, TIED_MARK, Spread, marks, spread
from qwen3_trn.results.quantities import QUANTITIES, Better, Quantity

BAR_COLOR = "#4c72b0"
# The colour map of every heatmap: its yellow end is the better one.
HEATMAP_CMAP = "viridis"


@dataclass
class HeatmapCell:
    row: int
    column: int
    value: float  # the mean over the config's seeds
    text: str  # the mean as written in the cell
    color: str
    low: float | None = None  # the seeds' range, where there are several
    high: float | None = None
    mark: str = ""  # against the best config (seeds.MARKS_LEGEND)


@dataclass
class Plot:
    id: str
    title: str
    png: bytes | None = None
    svg: str | None = None
    caption: str = ""
    # heatmaps: the figure (its key), the grid (row / column keys and values) and its drawn cells
    figure: str = ""
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
    """Inline SVG: text kept as text, ids from the artists' gids, and every other id (and reference
    to it) prefixed, so several SVGs share one page."""
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
    key = "val_loss" if done and all(r.figures.get("val_loss") is not None for r in done) else "last_loss"
    return key, QUANTITIES[key].name


def _trained_configs(collection: Collection) -> list[ConfigRuns]:
    return [c for c in collection.configs if c.trained]


def _capital(text: str) -> str:
    return text[0].upper() + text[1:]


def _seeds_phrase(collection: Collection) -> str:
    n = collection.seeds_per_config
    return f"mean of {n} seeds, their range (min–max) shaded or as bars" if n > 1 else "one seed per config: no seed spread shown"


def _number_axis(axis, quantity: Quantity) -> None:
    from matplotlib.ticker import FuncFormatter

    axis.set_major_formatter(FuncFormatter(lambda value, _pos: quantity.format(value)))


def plot_loss(collection: Collection) -> Plot | None:
    configs = _trained_configs(collection)
    if not configs:
        return None
    from matplotlib.ticker import MaxNLocator

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    any_val = False
    for index, config in enumerate(configs):
        color = f"C{index % 10}"
        train = _per_step(config, "loss")
        held_out = _per_step(config, "val_loss")
        steps = sorted(train)
        ax.plot(
            steps, [train[s].mean for s in steps], color=color, marker="o", markersize=2.5, linewidth=1.2, label=f"{config.label} (train)"
        )
        if any(train[s].n > 1 for s in steps):
            ax.fill_between(steps, [train[s].low for s in steps], [train[s].high for s in steps], color=color, alpha=0.2, linewidth=0)
        if held_out:
            any_val = True
            val_steps = sorted(held_out)
            ax.errorbar(
                val_steps,
                [held_out[s].mean for s in val_steps],
                yerr=[[held_out[s].mean - held_out[s].low for s in val_steps], [held_out[s].high - held_out[s].mean for s in val_steps]],
                color=color,
                marker="D",
                markersize=5,
                linestyle="--",
                linewidth=1.5,
                capsize=3,
                label=f"{config.label} (validation)",
            )
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    _number_axis(ax.yaxis, QUANTITIES["last_loss"])
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title("Training and validation loss vs step" if any_val else "Training loss vs step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    caption = "solid: training loss of each step; dashed diamonds: held-out validation loss" if any_val else "training loss of each step"
    return Plot("loss_vs_step", "Loss vs step", png=_png(fig), caption=f"{caption}; {_seeds_phrase(collection)}")


def _per_step(config: ConfigRuns, key: str) -> dict[int, Spread]:
    """``key`` at each step over the config's seeds."""
    values: dict[int, list[float]] = {}
    for run in config.trained:
        for record in run.records:
            if key in record:
                values.setdefault(int(record["step"]), []).append(record[key])
    return {step: spread(v) for step, v in values.items()}


def plot_bars(collection: Collection, key: str, plot_id: str, note: str = "") -> Plot | None:
    """One bar per config from zero (its mean), the seeds' range as an error bar, each seed a dot."""
    quantity = QUANTITIES[key]
    rows = [
        (c.label, c.spread(key), [r.figures[key] for r in c.trained if r.figures.get(key) is not None])
        for c in _trained_configs(collection)
    ]
    rows = [(label, s, seeds) for label, s, seeds in rows if s is not None]
    if not rows:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 0.7 + 0.5 * len(rows)))
    several = any(s.n > 1 for _, s, _ in rows)
    ax.barh(range(len(rows)), [s.mean for _, s, _ in rows], color=BAR_COLOR, height=0.6)
    if several:
        ax.errorbar(
            [s.mean for _, s, _ in rows],
            range(len(rows)),
            xerr=[[s.mean - s.low for _, s, _ in rows], [s.high - s.mean for _, s, _ in rows]],
            fmt="none",
            ecolor="black",
            capsize=4,
        )
        for i, (_, _, seeds) in enumerate(rows):
            ax.plot(seeds, [i] * len(seeds), "o", color="black", markersize=3, alpha=0.7)
    for i, (_, s, _) in enumerate(rows):
        ax.text(s.high if several else s.mean, i, f"  {s.text(quantity)}", va="center", fontsize=8)
    ax.set_yticks(range(len(rows)), [label for label, _, _ in rows])
    ax.invert_yaxis()
    ax.set_xlim(0, max(s.high for _, s, _ in rows) * 1.3)
    _number_axis(ax.xaxis, quantity)
    ax.set_xlabel(f"{quantity.column} ({quantity.direction()})")
    title = _capital(quantity.name) + (f" ({note})" if note else "")
    ax.set_title(title)
    ax.grid(axis="x", alpha=0.3)
    caption = f"{quantity.column} of each config; " + (
        "bar: mean of its seeds, line: their range, dots: each seed" if several else "one seed each"
    )
    return Plot(plot_id, _capital(quantity.name), png=_png(fig), caption=caption)


def _series(configs: list[ConfigRuns], key: str) -> dict[str, list[ConfigRuns]]:
    """Configs grouped by their values of the swept keys other than ``key``."""
    series: dict[str, list[ConfigRuns]] = {}
    for config in configs:
        name = ", ".join(f"{k}={v}" for k, v in config.params.items() if k != key) or "runs"
        series.setdefault(name, []).append(config)
    return series


def plot_final_vs(collection: Collection, key: str) -> Plot | None:
    """The final loss against one swept key: lines in bands for a numeric key, points with range
    bars for a categorical one (no bars: a loss axis does not start at zero)."""
    figure_key, name = final_loss_key(collection.runs)
    quantity = QUANTITIES[figure_key]
    configs = [c for c in _trained_configs(collection) if key in c.params and c.spread(figure_key) is not None]
    if not configs:
        return None
    values, numeric = ordered_values([c.params[key] for c in configs])
    series = _series(configs, key)
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    width = 0.5 / len(series)
    for s, (label, members) in enumerate(series.items()):
        color = f"C{s % 10}"
        points = []
        for config in members:
            x = number(config.params[key]) if numeric else values.index(config.params[key]) - 0.25 + width * (s + 0.5)
            points.append((x, config.spread(figure_key), [r.figures[figure_key] for r in config.trained]))
        points.sort(key=lambda p: p[0])
        xs, spreads = [p[0] for p in points], [p[1] for p in points]
        several = any(sp.n > 1 for sp in spreads)
        ax.errorbar(
            xs,
            [sp.mean for sp in spreads],
            yerr=[[sp.mean - sp.low for sp in spreads], [sp.high - sp.mean for sp in spreads]] if several else None,
            color=color,
            marker="o",
            linestyle="-" if numeric else "none",
            capsize=4,
            label=label,
        )
        if numeric and several:
            ax.fill_between(xs, [sp.low for sp in spreads], [sp.high for sp in spreads], color=color, alpha=0.15, linewidth=0)
        for x, sp, seeds in points:
            if several:
                ax.plot([x] * len(seeds), seeds, ".", color=color, alpha=0.6)
            ax.annotate(quantity.format(sp.mean), (x, sp.high), textcoords="offset points", xytext=(4, 4), fontsize=7)
    if numeric and len(values) <= 12:
        ax.set_xticks([number(v) for v in values], values)
    elif not numeric:
        ax.set_xticks(range(len(values)), values)
        ax.set_xlim(-0.6, len(values) - 0.4)
    _number_axis(ax.yaxis, quantity)
    ax.set_xlabel(key)
    ax.set_ylabel(f"{name} ({quantity.direction()})")
    ax.set_title(f"{_capital(name)} vs {key}")
    ax.grid(alpha=0.3)
    if len(series) > 1:
        ax.legend(fontsize=8, loc="best")
    kind = "lines against the value" if numeric else "a point per value"
    return Plot(
        f"final_loss_vs_{key}", f"Final loss vs {key}", png=_png(fig), caption=f"{name} of each config, {kind}; {_seeds_phrase(collection)}"
    )


def plot_heatmap(collection: Collection, keys: list[str], figure_key: str, plot_id: str) -> Plot | None:
    """``figure_key`` over the grid of two swept keys (rows: the first, columns: the second)."""
    row_key, column_key = keys
    quantity = QUANTITIES[figure_key]
    grid: dict[tuple[str, str], Spread] = {}
    for config in _trained_configs(collection):
        s = config.spread(figure_key)
        if s is not None and row_key in config.params and column_key in config.params:
            grid.setdefault((config.params[row_key], config.params[column_key]), s)
    if not grid:
        return None
    rows, _ = ordered_values([r for r, _ in grid])
    columns, _ = ordered_values([c for _, c in grid])
    import matplotlib
    from matplotlib.colors import Normalize
    from matplotlib.patches import Rectangle

    plt = _pyplot()
    means = [s.mean for s in grid.values()]
    low, high = min(means), max(means)
    norm = Normalize(vmin=low, vmax=high if high > low else low + 1e-9)
    # yellow (the map's top) is better: a lower-is-better figure takes the map reversed
    colormap = matplotlib.colormaps[HEATMAP_CMAP if quantity.better == Better.higher else HEATMAP_CMAP + "_r"]
    several = any(s.n > 1 for s in grid.values())
    marked = marks(quantity, grid)
    fig, ax = plt.subplots(figsize=(1.8 + 1.6 * len(columns), 1.2 + (1.0 if several else 0.9) * len(rows)))
    cells = []
    for i, row in enumerate(rows):
        for j, column in enumerate(columns):
            s = grid.get((row, column))
            if s is None:
                ax.add_patch(Rectangle((j, i), 1, 1, facecolor="#eeeeee", edgecolor="white", hatch="//"))
                ax.text(j + 0.5, i + 0.5, "n/a", ha="center", va="center", fontsize=9, color="#888888")
                continue
            rgba = colormap(norm(s.mean))
            color = matplotlib.colors.to_hex(rgba)
            mark = marked.get((row, column), "")
            ax.add_patch(Rectangle((j, i), 1, 1, facecolor=color, edgecolor="white", linewidth=2, gid=f"{plot_id}-cell-{i}-{j}"))
            text = quantity.format(s.mean)
            ink = "black" if 0.2126 * rgba[0] + 0.7152 * rgba[1] + 0.0722 * rgba[2] > 0.5 else "white"
            y = i + (0.4 if s.n > 1 else 0.5)
            ax.text(
                j + 0.5,
                y,
                f"{mark} {text}".strip(),
                ha="center",
                va="center",
                fontsize=11,
                fontweight="bold",
                color=ink,
                gid=f"{plot_id}-value-{i}-{j}",
            )
            if s.n > 1:
                ax.text(
                    j + 0.5,
                    i + 0.7,
                    f"{quantity.format(s.low)}–{quantity.format(s.high)}",
                    ha="center",
                    va="center",
                    fontsize=8,
                    color=ink,
                    gid=f"{plot_id}-range-{i}-{j}",
                )
            cells.append(HeatmapCell(i, j, s.mean, text, color, s.low if s.n > 1 else None, s.high if s.n > 1 else None, mark))
    ax.set_xlim(0, len(columns))
    ax.set_ylim(len(rows), 0)
    ax.set_xticks([j + 0.5 for j in range(len(columns))], columns)
    ax.set_yticks([i + 0.5 for i in range(len(rows))], rows)
    ax.set_xlabel(column_key)
    ax.set_ylabel(row_key)
    title = _capital(quantity.name) + (f" ({quantity.unit})" if quantity.unit else "")
    ax.set_title(title)
    ax.tick_params(length=0)
    for spine in ax.spines.values():
        spine.set_visible(False)
    bar = fig.colorbar(matplotlib.cm.ScalarMappable(norm=norm, cmap=colormap), ax=ax, fraction=0.05, pad=0.04)
    if quantity.better != Better.higher:
        bar.ax.invert_yaxis()  # the better end on top in every heatmap
    _number_axis(bar.ax.yaxis, quantity)
    bar.set_label(f"{quantity.direction()} (yellow, top)", fontsize=8)
    spread_note = (
        f"each cell the mean of its seeds and their range (min–max) under it; {BEST_MARK} best, {TIED_MARK} within the seed spread of the best"
        if several
        else "one seed per config: no seed spread"
    )
    return Plot(
        plot_id,
        title,
        svg=_svg(fig, plot_id),
        figure=figure_key,
        caption=f"{title} for each {row_key} × {column_key}: {spread_note}; yellow: better ({quantity.direction()})",
        rows=(row_key, rows),
        columns=(column_key, columns),
        cells=cells,
    )


def grid_keys(runs: list[RunData], swept_keys: list[str]) -> list[str]:
    """The swept keys whose values differ between the trained runs (a skipped job does not count)."""
    done = trained(runs)
    return [k for k in swept_keys if len({r.params.get(k) for r in done}) > 1]


# The figures of a two-key grid, one heatmap each: (figure key, plot id); the final loss first.
GRID_FIGURES = (("tokens_per_s", "heatmap_tokens_per_s"), ("peak_memory_gib", "heatmap_peak_memory"))


def heatmaps(collection: Collection) -> list[Plot]:
    """For two swept keys: final validation (else training) loss, tokens/s and peak memory."""
    keys = grid_keys(collection.runs, collection.config_keys)
    if len(keys) != 2:
        return []
    figure_key, _ = final_loss_key(collection.runs)
    loss_id = "heatmap_val_loss" if figure_key == "val_loss" else "heatmap_loss"
    plots = [plot_heatmap(collection, keys, key, plot_id) for key, plot_id in ((figure_key, loss_id), *GRID_FIGURES)]
    return [p for p in plots if p is not None]


def make_plots(collection: Collection) -> list[Plot]:
    runs = collection.runs
    plots = heatmaps(collection) + [
        plot_loss(collection),
        plot_bars(collection, "tokens_per_s", "tokens_per_s", "steady state, step 1 excluded"),
        plot_bars(collection, "peak_memory_gib", "peak_memory", "max reserved"),
    ]
    if any("mfu_pct" in r.figures for r in runs):
        plots.append(plot_bars(collection, "mfu_pct", "mfu"))
    plots += [plot_final_vs(collection, key) for key in collection.config_keys]
    return [p for p in plots if p is not None]
