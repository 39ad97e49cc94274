"""Comparison reports from finished runs' own files, without any server, looked at in a real browser."""

from __future__ import annotations

import csv
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from qwen3_trn.report import build_report
from qwen3_trn.report.render import make_plots
from tests.conftest import chromium, needs_chromium

REPO = Path(__file__).resolve().parents[1]
GRID = [("native", 1), ("native", 2), ("hf_v5", 1), ("hf_v5", 2)]


# The loss a seed adds: seed 42 (the default) nothing, the next ones in turns -0.03, +0.03.
SEED_OFFSET = {42: 0.0, 43: -0.03, 44: 0.03}


def _loss(step: int, backend: str, top_k: int, seed: int = 42) -> float:
    return 8.0 - 0.3 * step - 0.1 * top_k - (0.05 if backend == "native" else 0.0) + SEED_OFFSET[seed]


def _val_loss(step: int, backend: str, top_k: int, seed: int = 42) -> float:
    return _loss(step, backend, top_k, seed) + 0.2


def fake_run(
    run_dir: Path,
    overrides: list[str],
    backend: str,
    top_k: int,
    steps: int = 4,
    status: str = "completed",
    val_tokens: str = "ab" * 32,
    seed: int = 42,
) -> None:
    """A run directory as a training run leaves it (metrics.jsonl with validations after step 1 and
    at the last step, summary.json, overrides.yaml)."""
    run_dir.mkdir(parents=True)
    records = [
        {
            "step": s,
            "loss": _loss(s, backend, top_k, seed),
            "grad_norm": 1.0,
            "tokens_per_s": 1000.0 * top_k + s + (seed - 42) * 10,
            "memory_peak_gib": 0.5 * top_k,
            "mfu_pct": 1.5,
            "lr_AdamW": 1e-3,
        }
        for s in range(1, steps + 1)
    ]
    for record in (records[0], records[-1]):
        val_loss = _val_loss(record["step"], backend, top_k, seed)
        record.update(val_loss=val_loss, val_perplexity=math.exp(val_loss))
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (run_dir / "summary.json").write_text(
        json.dumps({"status": status, "backend": backend, "seed": seed, "wall_time_s": 12.5, "validation_tokens_sha256": val_tokens})
    )
    (run_dir / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))


def make_sweep(sweep_dir: Path, seeds: tuple[int, ...] = (42,), experiment: str | None = None) -> Path:
    """A finished sweep: the grid's jobs (each once per seed), one skipped job (no run files) and a manifest."""
    jobs = []
    for backend, top_k in GRID:
        for seed in seeds:
            num = len(jobs)
            overrides = [f"backend={backend}", f"model.top_k={top_k}", "model=tiny_moe", "training.steps=4"]
            overrides += [f"training.seed={seed}"] if len(seeds) > 1 else []
            fake_run(sweep_dir / str(num), overrides, backend, top_k, seed=seed)
            jobs.append({"num": num, "overrides": overrides, "run_dir": str(sweep_dir / str(num)), "status": "completed"})
    skipped = ["backend=native", "model.top_k=4", "model=tiny", "training.steps=4"]
    (sweep_dir / str(len(jobs))).mkdir()
    jobs.append(
        {
            "num": len(jobs),
            "overrides": skipped,
            "run_dir": str(sweep_dir / str(len(jobs))),
            "status": "skipped",
            "reason": "model.top_k: model=debugmodel is a dense flavor",
        }
    )
    keys = ["backend", "model.top_k", *(["training.seed"] if len(seeds) > 1 else [])]
    manifest = {"group": "g1", "experiment": experiment, "swept_keys": keys, "seeds": len(seeds), "jobs": jobs}
    (sweep_dir / "manifest.json").write_text(json.dumps(manifest))
    return sweep_dir


@pytest.fixture
def sweep(tmp_path) -> Path:
    """4 trained jobs of one seed each and a skipped one."""
    return make_sweep(tmp_path / "sweep")


@pytest.fixture
def seeds_sweep(tmp_path) -> Path:
    """experiment=moe_grid-like: the 2 x 2 grid with 2 seeds (43, 44: -0.03 and +0.03 on every loss) per config."""
    return make_sweep(tmp_path / "seeds", seeds=(43, 44), experiment="moe_grid")


def test_report_from_metrics_files_alone(sweep, tmp_path):
    result = build_report([sweep], out_dir=tmp_path / "out")
    collection = result.collection
    assert [r.status for r in collection.runs] == ["completed"] * 4 + ["skipped"]
    # backend and top_k vary; model varies only because of the skipped dense job
    assert collection.swept_keys[:2] == ["backend", "model.top_k"] and "training.steps" not in collection.swept_keys
    assert [r.source for r in collection.runs] == ["metrics"] * 4 + ["none"]
    assert collection.runs[0].label.startswith("backend=native, model.top_k=1")
    html = result.html.read_text()
    assert html.count("<tr data-run=") == 5 and 'data-status="skipped"' in html
    for plot in ("loss_vs_step", "tokens_per_s", "peak_memory", "mfu", "final_loss_vs_backend", "final_loss_vs_model.top_k"):
        assert f'<figure id="{plot}">' in html
    assert "does not apply" in html
    # the swept keys that vary between trained runs form a grid: one heatmap per figure, values in the cells
    plots = {p.id: p for p in make_plots(collection)}
    for plot_id in ("heatmap_val_loss", "heatmap_tokens_per_s", "heatmap_peak_memory"):
        assert f'<figure id="{plot_id}" class="heatmap"' in html
        heatmap = plots[plot_id]
        assert heatmap.rows == ("backend", ["native", "hf_v5"]) and heatmap.columns == ("model.top_k", ["1", "2"])
        assert len(heatmap.cells) == 4 and all(f'id="{plot_id}-cell-{c.row}-{c.column}"' in heatmap.svg for c in heatmap.cells)
    cells = {(c.row, c.column): c for c in plots["heatmap_val_loss"].cells}
    assert cells[(1, 0)].value == pytest.approx(_val_loss(4, "hf_v5", 1)) and cells[(1, 0)].text == f"{_val_loss(4, 'hf_v5', 1):.3f}"
    assert f">{cells[(1, 0)].text}</text>" in plots["heatmap_val_loss"].svg
    # a categorical key gets bars per value, a numeric key lines against its value
    assert "a point per value" in plots["final_loss_vs_backend"].caption
    assert "lines against the value" in plots["final_loss_vs_model.top_k"].caption
    assert "final validation loss" in plots["final_loss_vs_backend"].caption
    with result.csv.open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 5
    row = rows[1]  # native, top_k=2
    assert (row["backend"], row["model.top_k"], row["status"]) == ("native", "2", "completed")
    assert float(row["final_loss"]) == pytest.approx(_loss(4, "native", 2))
    assert float(row["val_loss"]) == pytest.approx(_val_loss(4, "native", 2))
    assert float(row["val_perplexity"]) == pytest.approx(math.exp(_val_loss(4, "native", 2)))
    assert row["validation_tokens_sha256"] == "ab" * 32
    assert float(row["tokens_per_s"]) == pytest.approx(2003.0)  # steps 2-4: step 1 is warm-up
    assert float(row["peak_memory_gib"]) == 1.0
    markdown = result.markdown.read_text()
    # a table of configs and a table of runs (one per seed, with their bookkeeping)
    configs, runs = markdown.split("## Configs")[1].split("## Runs")
    assert configs.count("\n| native |") + configs.count("\n| hf_v5 |") == 5 and runs.count("\n| backend=") == 5 and "| skipped |" in runs
    assert "validation tokens" in runs and "validation tokens" not in configs and "source" not in configs
    assert "one seed (training.seed 42)" in markdown and "seed noise" in markdown
    assert "| 2,003 |" in configs and "| 1.5 |" in configs  # tokens/s and MFU (%) as people write them
    assert "**Final validation loss** (rows: backend, columns: model.top_k)" in markdown
    assert f"| hf_v5 | {_val_loss(4, 'hf_v5', 1):.3f} | {_val_loss(4, 'hf_v5', 2):.3f} |" in markdown
    assert "different validation tokens" not in markdown


def test_report_says_when_runs_evaluated_different_validation_tokens(tmp_path):
    fake_run(tmp_path / "a", ["training.seq_len=64"], "native", 1, val_tokens="ab" * 32)
    fake_run(tmp_path / "b", ["training.seq_len=128"], "native", 1, val_tokens="cd" * 32)
    result = build_report([tmp_path / "a", tmp_path / "b"], out_dir=tmp_path / "out")
    assert any("different validation tokens" in note for note in result.notes)
    assert "validation.seq_len" in result.markdown.read_text()


def test_wandb_report_has_the_same_panels(sweep):
    """The --publish Report, built offline (wandb-workspaces objects; save() would need a server)."""
    wr = pytest.importorskip("wandb_workspaces.reports.v2")
    from qwen3_trn.report import collect
    from qwen3_trn.report.publish import wandb_report

    collection = collect([sweep])
    report = wandb_report(wr, collection, "qwen3_trn", "my-team", "grid")  # an entity: no login needed
    panels = report.blocks[0].panels
    by_title = {p.title: p for p in panels}
    loss = by_title["training and validation loss"]
    assert isinstance(loss, wr.LinePlot) and loss.y == ["loss", "val_loss"]
    backend = by_title["final validation loss by backend"]  # categorical: bars per value
    assert isinstance(backend, wr.BarPlot) and backend.groupby == wr.Config("run.params.backend")
    assert backend.metrics == [wr.SummaryMetric("val_loss")]
    top_k = by_title["final validation loss vs model.top_k"]  # numeric: against its value
    assert isinstance(top_k, wr.ScatterPlot) and top_k.x == wr.Config("model.top_k")
    heatmaps = [p for p in panels if p.title.startswith("heatmap: ")]
    assert [p.z for p in heatmaps] == [wr.SummaryMetric(k) for k in ("val_loss", "tokens_per_s", "peak_memory_gib")]
    assert all(p.x == wr.Config("model.top_k") and p.y == wr.Config("run.params.backend") for p in heatmaps)


def test_report_over_run_directories_on_the_command_line(sweep, tmp_path):
    out = tmp_path / "cli"
    args = [sys.executable, "-m", "qwen3_trn.report", str(sweep / "0"), str(sweep / "3"), "--out", str(out)]
    done = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "2 runs (completed); swept: backend, model.top_k" in done.stdout
    assert (out / "report.html").read_text().count("<tr data-run=") == 2
    missing = subprocess.run(
        [sys.executable, "-m", "qwen3_trn.report", str(tmp_path / "nope")], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert missing.returncode == 2 and "does not exist" in missing.stderr


def test_publish_without_key_says_so_and_writes_the_local_report(sweep, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env["HOME"] = str(tmp_path)  # no ~/.netrc from `wandb login`
    out = tmp_path / "pub"
    done = subprocess.run(
        [sys.executable, "-m", "qwen3_trn.report", str(sweep), "--publish", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert re.search(r"wandb Report not published: (wandb-workspaces is not installed|no wandb API key)", done.stdout)
    assert (out / "report.html").is_file() and "not published" in (out / "report.html").read_text()


def test_a_seeds_sweep_reports_the_mean_and_spread_in_every_figure(seeds_sweep, tmp_path):
    result = build_report([seeds_sweep], out_dir=tmp_path / "out")
    collection = result.collection
    assert collection.config_keys[:2] == ["backend", "model.top_k"] and "training.seed" in collection.swept_keys
    assert collection.title == "Sweep experiment=moe_grid: backend × model.top_k, 2 seeds each"
    trained = [c for c in collection.configs if c.trained]
    assert [c.seeds for c in trained] == [[43, 44]] * 4
    plots = {p.id: p for p in make_plots(collection)}
    # every figure states the spread: the plots in their captions, the heatmaps in every cell
    for plot in plots.values():
        assert "mean" in plot.caption and ("range" in plot.caption or "min–max" in plot.caption), (plot.id, plot.caption)
    for plot_id in ("heatmap_val_loss", "heatmap_tokens_per_s", "heatmap_peak_memory"):
        heatmap = plots[plot_id]
        assert len(heatmap.cells) == 4 and all(c.low is not None and c.high is not None for c in heatmap.cells)
        assert all(f'id="{plot_id}-range-{c.row}-{c.column}"' in heatmap.svg for c in heatmap.cells)
    cells = {(c.row, c.column): c for c in plots["heatmap_val_loss"].cells}
    native_2 = cells[(0, 1)]  # the best: 6.75 +- 0.03
    assert native_2.value == pytest.approx(_val_loss(4, "native", 2)) and native_2.text == "6.750"
    assert (native_2.low, native_2.high) == (pytest.approx(6.72), pytest.approx(6.78))
    assert ">6.720–6.780</text>" in plots["heatmap_val_loss"].svg
    # the best, one within its seed spread (6.77-6.83 overlaps 6.72-6.78), two worse beyond it
    assert [native_2.mark, cells[(1, 1)].mark, cells[(0, 0)].mark, cells[(1, 0)].mark] == ["★", "≈", "", ""]
    # the better end is yellow in every heatmap: the best loss and the most tokens/s alike
    best_tokens = max(plots["heatmap_tokens_per_s"].cells, key=lambda c: c.value)
    worst_tokens = min(plots["heatmap_tokens_per_s"].cells, key=lambda c: c.value)
    assert _yellowness(native_2.color) > _yellowness(cells[(1, 0)].color)
    assert _yellowness(best_tokens.color) > _yellowness(worst_tokens.color)

    markdown = result.markdown.read_text()
    assert "Each config ran with 2 seeds (training.seed 43, 44)" in markdown and "★ the best mean" in markdown
    assert "| native | 6.850 (6.820–6.880) | ★ 6.750 (6.720–6.780) ★ |" not in markdown  # the mark once, after the range
    assert "| native | 6.850 (6.820–6.880) | 6.750 (6.720–6.780) ★ |" in markdown
    configs = markdown.split("## Configs")[1].split("## Runs")[0]
    assert "| native | 2 | tiny_moe | 43, 44 | 2 completed | 6.750 (6.720–6.780) ★ |" in configs
    with result.csv.open() as handle:
        rows = list(csv.DictReader(handle))
    assert [r["seed"] for r in rows[:2]] == ["43", "44"] and float(rows[0]["val_loss"]) == pytest.approx(_val_loss(4, "native", 1, 43))


def test_one_seed_marks_nothing_and_says_so(sweep, tmp_path):
    result = build_report([sweep], out_dir=tmp_path / "out")
    plots = make_plots(result.collection)
    assert all(not c.mark and c.low is None for p in plots for c in p.cells)
    assert all("one seed" in p.caption for p in plots), [p.caption for p in plots]
    assert "★" not in result.markdown.read_text()


def _yellowness(color: str) -> int:
    red, green, blue = (int(color[i : i + 2], 16) for i in (1, 3, 5))
    return red + green - 2 * blue


@needs_chromium
def test_report_renders_in_a_real_browser(seeds_sweep, tmp_path):
    result = build_report([seeds_sweep], out_dir=tmp_path / "out")
    url = result.html.resolve().as_uri()
    dom = chromium(url, tmp_path / "profile", "--dump-dom")
    # the page's own script counted the plot images the browser decoded
    expected = result.html.read_text().count('<img class="plot"')
    assert expected >= 6
    assert f'data-plots-loaded="{expected}"' in dom.stdout and f'data-plots-total="{expected}"' in dom.stdout
    assert f"[{expected}/{expected} plots]</title>" in dom.stdout
    # a row per config with its seeds, and every run (one per seed) in the table of runs
    assert len(re.findall(r'<tr data-config="[^"]+" data-seeds="2"', dom.stdout)) == 4
    rows = re.findall(r'<tr data-run="([^"]+)" data-status="(\w+)"', dom.stdout)
    assert len(rows) == 9 and [s for _, s in rows] == ["completed"] * 8 + ["skipped"]
    assert {label.split(",")[0] for label, _ in rows} == {"backend=native", "backend=hf_v5"}

    # every heatmap cell was laid out with a size and a fill (three 2 x 2 heatmaps), its range under its mean
    assert 'data-heatmap-cells-drawn="12"' in dom.stdout
    assert len(re.findall(r'<figure id="heatmap_\w+" class="heatmap"[^>]*data-cells-drawn="4"', dom.stdout)) == 3
    assert len(re.findall(r'id="heatmap_\w+-range-\d-\d"', dom.stdout)) == 12

    shot = tmp_path / "shot.png"
    chromium(url, tmp_path / "profile", "--window-size=1280,2400", f"--screenshot={shot}")
    from PIL import Image

    assert Image.open(shot).size == (1280, 2400)


def test_every_figure_of_a_run_is_taken_as_its_table_says(sweep, tmp_path):
    """``records.summarize`` writes the figures of ``qwen3_trn.results.quantities`` in the table's order,
    each from the records the table names; the report's CSV has a column for each reported one."""
    from qwen3_trn.results.quantities import QUANTITIES, REPORTED
    from qwen3_trn.results.records import read_metrics, summarize

    records = read_metrics(sweep / "1")  # native, top_k=2: four steps, validated at steps 1 and 4
    figures = summarize(records)
    sourced = [key for key, quantity in QUANTITIES.items() if quantity.source]
    assert list(figures) == [key for key in sourced if key in figures]
    assert set(sourced) - set(figures) == {"seconds_to_first_step"}  # these records carry no seconds_since_launch
    assert (figures["first_step"], figures["last_step"], figures["val_step"], figures["validations"]) == (1, 4, 4, 2)
    assert figures["first_val_loss"] == pytest.approx(_val_loss(1, "native", 2))
    assert figures["min_val_loss"] == figures["val_loss"] == pytest.approx(_val_loss(4, "native", 2))
    assert figures["min_loss"] == figures["last_loss"] == pytest.approx(_loss(4, "native", 2))
    # MFU only where every steady step has it; a run without a training step: its count, zero
    gap = [{k: v for k, v in r.items() if not (k == "mfu_pct" and r["step"] == 3)} for r in records]
    assert "mfu_pct" not in summarize(gap) and summarize(gap)["tokens_per_s"] == figures["tokens_per_s"]
    assert summarize([{"step": 1, "val_loss": 3.0}]) == {"steps_logged": 0}

    build_report([sweep], out_dir=tmp_path / "out")
    with (tmp_path / "out" / "report.csv").open() as handle:
        header = next(csv.reader(handle))
    columns = [QUANTITIES[key].csv or key for key in REPORTED]
    start = header.index(columns[0])
    assert header[start : start + len(columns)] == columns and "final_loss" in columns
