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


def _loss(step: int, backend: str, top_k: int) -> float:
    return 8.0 - 0.3 * step - 0.1 * top_k - (0.05 if backend == "native" else 0.0)


def _val_loss(step: int, backend: str, top_k: int) -> float:
    return _loss(step, backend, top_k) + 0.2


def fake_run(
    run_dir: Path, overrides: list[str], backend: str, top_k: int, steps: int = 4, status: str = "completed", val_tokens: str = "ab" * 32
) -> None:
    """A run directory as a training run leaves it (metrics.jsonl with validations after step 1 and
    at the last step, summary.json, overrides.yaml)."""
    run_dir.mkdir(parents=True)
    records = [
        {
            "step": s,
            "loss": _loss(s, backend, top_k),
            "grad_norm": 1.0,
            "tokens_per_s": 1000.0 * top_k + s,
            "memory_peak_gib": 0.5 * top_k,
            "mfu_pct": 1.5,
            "lr_AdamW": 1e-3,
        }
        for s in range(1, steps + 1)
    ]
    for record in (records[0], records[-1]):
        record.update(
            val_loss=_val_loss(record["step"], backend, top_k), val_perplexity=math.exp(_val_loss(record["step"], backend, top_k))
        )
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (run_dir / "summary.json").write_text(
        json.dumps({"status": status, "backend": backend, "wall_time_s": 12.5, "validation_tokens_sha256": val_tokens})
    )
    (run_dir / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))


@pytest.fixture
def sweep(tmp_path) -> Path:
    """A finished sweep: 4 trained jobs, one skipped job (no run files) and a manifest."""
    sweep_dir = tmp_path / "sweep"
    jobs = []
    for num, (backend, top_k) in enumerate(GRID):
        overrides = [f"backend={backend}", f"model.top_k={top_k}", "model=tiny_moe", "training.steps=4"]
        fake_run(sweep_dir / str(num), overrides, backend, top_k)
        jobs.append({"num": num, "overrides": overrides, "run_dir": str(sweep_dir / str(num)), "status": "completed"})
    skipped = ["backend=native", "model.top_k=4", "model=tiny", "training.steps=4"]
    (sweep_dir / "4").mkdir()
    jobs.append(
        {
            "num": 4,
            "overrides": skipped,
            "run_dir": str(sweep_dir / "4"),
            "status": "skipped",
            "reason": "model.top_k: model=debugmodel is a dense flavor",
        }
    )
    (sweep_dir / "manifest.json").write_text(json.dumps({"group": "g1", "swept_keys": ["backend", "model.top_k"], "jobs": jobs}))
    return sweep_dir


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
    assert cells[(1, 0)].value == pytest.approx(_val_loss(4, "hf_v5", 1)) and cells[(1, 0)].text == f"{_val_loss(4, 'hf_v5', 1):.4f}"
    assert f">{cells[(1, 0)].text}</text>" in plots["heatmap_val_loss"].svg
    # a categorical key gets bars per value, a numeric key lines against its value
    assert "one bar per value" in plots["final_loss_vs_backend"].caption
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
    assert markdown.count("\n| backend=") == 5 and "| skipped |" in markdown
    assert "**Final validation loss** (rows: backend, columns: model.top_k)" in markdown
    assert f"| hf_v5 | {_val_loss(4, 'hf_v5', 1):.4f} | {_val_loss(4, 'hf_v5', 2):.4f} |" in markdown
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


@needs_chromium
def test_report_renders_in_a_real_browser(sweep, tmp_path):
    result = build_report([sweep], out_dir=tmp_path / "out")
    url = result.html.resolve().as_uri()
    dom = chromium(url, tmp_path / "profile", "--dump-dom")
    # the page's own script counted the plot images the browser decoded
    expected = result.html.read_text().count('<img class="plot"')
    assert expected >= 6
    assert f'data-plots-loaded="{expected}"' in dom.stdout and f'data-plots-total="{expected}"' in dom.stdout
    assert f"[{expected}/{expected} plots]</title>" in dom.stdout
    # the table lists every run
    rows = re.findall(r'<tr data-run="([^"]+)" data-status="(\w+)"', dom.stdout)
    assert len(rows) == 5 and [s for _, s in rows] == ["completed"] * 4 + ["skipped"]
    assert {label.split(",")[0] for label, _ in rows} == {"backend=native", "backend=hf_v5"}

    # every heatmap cell was laid out with a size and a fill (three 2 x 2 heatmaps)
    assert 'data-heatmap-cells-drawn="12"' in dom.stdout
    assert len(re.findall(r'<figure id="heatmap_\w+" class="heatmap"[^>]*data-cells-drawn="4"', dom.stdout)) == 3

    shot = tmp_path / "shot.png"
    chromium(url, tmp_path / "profile", "--window-size=1280,1600", f"--screenshot={shot}")
    assert shot.is_file()
    from PIL import Image

    image = Image.open(shot).convert("RGB")
    assert image.size == (1280, 1600)
    pixels = list(getattr(image, "get_flattened_data", image.getdata)())
    # the plots' lines and bars (matplotlib's default blue, the bar colour) are on screen
    blue = sum(1 for r, g, b in pixels if b > 150 and r < 120 and g < 150)
    assert blue > 2000, blue
    assert sum(1 for p in pixels if p != (255, 255, 255)) > 0.05 * len(pixels)
