"""Comparison reports from finished runs' own files, without any server, looked at in a real browser."""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from qwen3_trn.report import build_report

REPO = Path(__file__).resolve().parents[1]
GRID = [("native", 1), ("native", 2), ("hf_v5", 1), ("hf_v5", 2)]


def _loss(step: int, backend: str, top_k: int) -> float:
    return 8.0 - 0.3 * step - 0.1 * top_k - (0.05 if backend == "native" else 0.0)


def fake_run(run_dir: Path, overrides: list[str], backend: str, top_k: int, steps: int = 4, status: str = "completed") -> None:
    """A run directory as a training run leaves it (metrics.jsonl, summary.json, overrides.yaml)."""
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
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (run_dir / "summary.json").write_text(json.dumps({"status": status, "backend": backend, "wall_time_s": 12.5}))
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
    with result.csv.open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 5
    row = rows[1]  # native, top_k=2
    assert (row["backend"], row["model.top_k"], row["status"]) == ("native", "2", "completed")
    assert float(row["final_loss"]) == pytest.approx(_loss(4, "native", 2))
    assert float(row["tokens_per_s"]) == pytest.approx(2003.0)  # steps 2-4: step 1 is warm-up
    assert float(row["peak_memory_gib"]) == 1.0
    markdown = result.markdown.read_text()
    assert markdown.count("\n| backend=") == 5 and "| skipped |" in markdown


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


def test_report_from_offline_wandb_runs(tmp_path):
    """Runs with no metrics file are read from their offline wandb runs (wandb's record format)."""
    script = """
import sys, wandb
from pathlib import Path
for run_dir, top_k in ((Path(sys.argv[1]) / "a", 1), (Path(sys.argv[1]) / "b", 2)):
    run_dir.mkdir(parents=True)
    overrides = ["model=tiny_moe", f"model.top_k={top_k}"]
    run = wandb.init(project="p", mode="offline", dir=str(run_dir), group="g", job_type="native", tags=["native"],
                     config={"backend": {"name": "native"}, "run": {"mode": "native", "overrides": overrides}},
                     settings=wandb.Settings(console="off", quiet=True))
    for step in range(1, 4):
        run.log({"loss": 6.0 - step * top_k * 0.1, "tokens_per_s": 50.0 * top_k, "memory_peak_gib": 0.25}, step=step)
    run.finish()
"""
    subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "runs")],
        check=True,
        capture_output=True,
        timeout=180,
        env={**os.environ, "WANDB_SILENT": "true"},
    )
    result = build_report([tmp_path / "runs"], out_dir=tmp_path / "out")
    runs = result.collection.runs
    assert [(r.source, r.status, r.backend) for r in runs] == [("wandb", "completed", "native")] * 2
    assert result.collection.swept_keys == ["model.top_k"] and [r.label for r in runs] == ["model.top_k=1", "model.top_k=2"]
    assert [r["step"] for r in runs[1].records] == [1, 2, 3]
    assert runs[1].figures["last_loss"] == pytest.approx(5.4) and runs[1].figures["tokens_per_s"] == 100.0
    assert result.html.read_text().count("<tr data-run=") == 2


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not on PATH (CI installs Debian's chromium package)")
def test_report_renders_in_a_real_browser(sweep, tmp_path):
    result = build_report([sweep], out_dir=tmp_path / "out")
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--hide-scrollbars",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--virtual-time-budget=10000",
    ]
    url = result.html.resolve().as_uri()
    dom = subprocess.run([CHROMIUM, *flags, "--dump-dom", url], capture_output=True, text=True, timeout=180)
    assert dom.returncode == 0, dom.stderr[-2000:]
    # the page's own script counted the plot images the browser decoded
    expected = result.html.read_text().count('<img class="plot"')
    assert expected >= 6
    assert f'data-plots-loaded="{expected}"' in dom.stdout and f'data-plots-total="{expected}"' in dom.stdout
    assert f"[{expected}/{expected} plots]</title>" in dom.stdout
    # the table lists every run
    rows = re.findall(r'<tr data-run="([^"]+)" data-status="(\w+)"', dom.stdout)
    assert len(rows) == 5 and [s for _, s in rows] == ["completed"] * 4 + ["skipped"]
    assert {label.split(",")[0] for label, _ in rows} == {"backend=native", "backend=hf_v5"}

    shot = tmp_path / "shot.png"
    done = subprocess.run(
        [CHROMIUM, *flags, "--window-size=1280,1600", f"--screenshot={shot}", url], capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0 and shot.is_file(), done.stderr[-2000:]
    from PIL import Image

    image = Image.open(shot).convert("RGB")
    assert image.size == (1280, 1600)
    pixels = list(getattr(image, "get_flattened_data", image.getdata)())
    # the plots' lines and bars (matplotlib's default blue, the bar colour) are on screen
    blue = sum(1 for r, g, b in pixels if b > 150 and r < 120 and g < 150)
    assert blue > 2000, blue
    assert sum(1 for p in pixels if p != (255, 255, 255)) > 0.05 * len(pixels)
