"""Real multirun sweeps on the CPU through the command line: one run directory and one offline
wandb run per job, shared group, failure isolation, skipped combinations, manifest, report."""

from __future__ import annotations

import csv
import html as html_module
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from qwen3_trn.config.schema import BackendConfig
from qwen3_trn.results.records import read_manifest, read_metrics, read_summary
from tests.commands import command_in_process, command_in_subprocess
from tests.conftest import chromium, needs_chromium, offline_wandb_files, read_offline_wandb_run

# The smallest run (conf/debug/smoke.yaml), 3 steps, with the wandb runs these tests read.
TINY = ["debug=smoke", "logger=wandb", "training.steps=3"]


def run_sweep(args: list[str], sweep_dir: Path, cli: bool = False) -> subprocess.CompletedProcess:
    """The sweep through the command's entry point in this process, or with ``cli`` as a real
    ``python -m qwen3_trn`` process (the moe_grid sweep: one real sweep process)."""
    args = [*args, f"hydra.sweep.dir={sweep_dir}"]
    return command_in_subprocess(args, timeout=900) if cli else command_in_process(args)


def _explain(result: subprocess.CompletedProcess) -> str:
    return f"exit {result.returncode}\nstdout:\n{result.stdout[-4000:]}\nstderr:\n{result.stderr[-4000:]}"


def assert_tracked_jobs(manifest: dict, mode_of: dict[int, str] | None = None) -> list:
    """Every completed job: its own run dir with metrics and exactly one offline wandb run,
    in the sweep's group, job_type = its mode, name from its overrides, real tags, full config."""
    runs = []
    for job in manifest["jobs"]:
        if job["status"] != "completed":
            continue
        run_dir = Path(job["run_dir"])
        records = read_metrics(run_dir)
        assert [r["step"] for r in records] == [1, 2, 3]
        files = offline_wandb_files(run_dir)
        assert len(files) == 1, files
        run = read_offline_wandb_run(files[0])
        summary = read_summary(run_dir)
        assert run.id == job["wandb_run_id"] == summary["wandb_run_id"]
        assert run.group == manifest["group"]
        mode = (mode_of or {}).get(job["num"], summary["backend"])
        assert run.job_type == mode and run.config["run"]["mode"] == mode
        assert run.name == job["name"] and run.name  # the swept overrides, e.g. "model.top_k=1,model.n_layers=2"
        assert {"sweep", mode, "cpu"} <= set(run.tags) and all(len(t) > 1 for t in run.tags)  # not split into letters
        # the project's composed config, not only torchtitan's, plus mode/kernel/device/git revision
        assert run.config["training"]["steps"] == 3 and run.config["model"]["flavor"]
        assert {"mode", "kernel", "device", "git_revision", "overrides"} <= run.config["run"].keys()
        assert re.fullmatch(r"[0-9a-f]{40}|unknown", run.config["run"]["git_revision"])
        assert run.config["run"]["overrides"] == job["overrides"]
        # per step: loss, grad norm, lr, tokens/s, MFU (meaningful on CPU here), memory
        assert [row["_step"] for row in run.history] == [1, 2, 3]
        expected = {"loss", "grad_norm", "lr", "tokens_per_s", "memory_peak_gib"}
        if mode == "native" or "mfu_pct" in records[0]:  # MFU where the run measures it (always on native CPU)
            expected.add("mfu_pct")
        for row in run.history:
            assert expected <= row.keys(), row.keys()
        # the held-out loss of each validation (after step 1 and at the last step), as in metrics.jsonl
        validated = {r["step"]: r["val_loss"] for r in records if "val_loss" in r}
        assert sorted(validated) == [1, 3]
        assert {row["_step"]: row["val_loss"] for row in run.history if "val_loss" in row} == pytest.approx(validated)
        assert all(row["val_perplexity"] == pytest.approx(math.exp(row["val_loss"])) for row in run.history if "val_loss" in row)
        assert run.exit_code == 0 and run.summary["last_loss"] == pytest.approx(records[-1]["loss"])
        assert run.summary["val_loss"] == pytest.approx(summary["val_loss"]) == pytest.approx(validated[3])
        runs.append(run)
    return runs


@pytest.fixture(scope="module")
def moe_grid(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    sweep_dir = tmp_path_factory.mktemp("moe_grid") / "grid"
    # experiment=moe_grid sweeps top_k x n_layers; the command line narrows both lists (2 x 2
    # configs), each with 2 seeds (42 and 43): 8 jobs.
    result = run_sweep(["experiment=moe_grid", "model.top_k=1,2", "model.n_layers=1,2", "sweep.seeds=2", *TINY], sweep_dir, cli=True)
    assert result.returncode == 0, _explain(result)
    return sweep_dir, result


@pytest.mark.slow
def test_moe_grid_sweep_tracks_every_job_and_reports(moe_grid):
    sweep_dir, result = moe_grid
    manifest = read_manifest(sweep_dir)
    assert manifest["counts"] == {"completed": 8, "failed": 0, "skipped": 0, "total": 8}
    assert manifest["experiment"] == "moe_grid" and manifest["swept_keys"] == ["model.top_k", "model.n_layers", "training.seed"]
    assert manifest["seeds"] == 2
    swept = ("model.top_k=", "model.n_layers=", "training.seed=")
    combos = [tuple(o for o in job["overrides"] if o.startswith(swept)) for job in manifest["jobs"]]
    # every config once per seed, seed after seed; the seed is one of the job's overrides and in its name
    assert combos == [
        (f"model.top_k={k}", f"model.n_layers={n}", f"training.seed={seed}") for seed in (42, 43) for k in (1, 2) for n in (1, 2)
    ]
    assert manifest["jobs"][4]["name"] == "model.top_k=1,model.n_layers=1,training.seed=43"
    assert len({job["run_dir"] for job in manifest["jobs"]}) == 8
    for job in manifest["jobs"]:
        summary = read_summary(Path(job["run_dir"]))
        k, n, seed = (int(o.split("=")[1]) for o in job["overrides"] if o.startswith(swept))
        assert summary["architecture"]["top_k"] == k and summary["architecture"]["n_layers"] == n
        assert summary["seed"] == seed  # recorded with the run
        assert job["final"]["last_loss"] == summary["last_loss"]
    runs = assert_tracked_jobs(manifest)
    assert {"moe_grid"} <= set(runs[0].tags)
    assert runs[0].config["model"]["top_k"] in (1, 2)

    # wandb's own tool reads the same run: tags are a list, group and job type as logged
    leet = subprocess.run(
        [
            sys.executable,
            "-m",
            "wandb",
            "leet",
            "inspect",
            "--summary",
            "--json",
            str(offline_wandb_files(Path(manifest["jobs"][0]["run_dir"]))[0]),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert leet.returncode == 0, leet.stderr
    seen = json.loads(leet.stdout)
    assert seen["tags"] == runs[0].tags and seen["run_id"] == runs[0].id and seen["name"] == runs[0].name

    # every job evaluated the same validation tokens (same data, tokenizer and shape), and says so
    summaries = [read_summary(Path(job["run_dir"])) for job in manifest["jobs"]]
    digests = {s["validation_tokens_sha256"] for s in summaries}
    assert len(digests) == 1 and re.fullmatch(r"[0-9a-f]{64}", digests.pop())
    assert {s["validation_tokens"] for s in summaries} == {4 * 2 * 64}  # validation.steps x batch x seq_len
    assert len({s["val_loss"] for s in summaries}) == 8  # eight different models (configs x seeds) on the same tokens
    # a seed changes the run: the same config's two seeds start from different losses
    assert all(summaries[i]["first_loss"] != summaries[i + 4]["first_loss"] for i in range(4))

    # the sweep's own report: every job, plots, final loss vs each swept key, heatmaps of the grid
    html = (sweep_dir / "report.html").read_text()
    assert html.count("<tr data-run=") == 8 and html.count('data-seeds="2"') == 4
    assert "<h1>Sweep experiment=moe_grid: model.top_k × model.n_layers, 2 seeds each</h1>" in html
    assert "Each config ran with 2 seeds (training.seed 42, 43)" in html
    for plot in (
        "loss_vs_step",
        "tokens_per_s",
        "peak_memory",
        "final_loss_vs_model.top_k",
        "final_loss_vs_model.n_layers",
        "heatmap_val_loss",
        "heatmap_tokens_per_s",
        "heatmap_peak_memory",
    ):
        assert f'id="{plot}"' in html
    with (sweep_dir / "report.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 8 and {r["status"] for r in rows} == {"completed"} and all(r["source"] == "metrics" for r in rows)
    for row, job in zip(rows, manifest["jobs"]):
        assert float(row["val_loss"]) == pytest.approx(job["final"]["val_loss"])
    assert "report:" in result.stdout and "8 jobs: 8 completed, 0 failed, 0 skipped" in result.stdout
    assert "2 seeds per config" in result.stdout
    markdown = (sweep_dir / "report.md").read_text()
    assert "**Final validation loss** (rows: model.top_k, columns: model.n_layers)" in markdown
    # the spread in every figure: each heatmap cell has its seeds' range, each plot says it shows them
    for figure_id in ("heatmap_val_loss", "heatmap_tokens_per_s", "heatmap_peak_memory"):
        assert len(re.findall(rf'id="{figure_id}-range-\d-\d"', html)) == 4
    for caption in re.findall(r"<figcaption>([^<]*)</figcaption>", html):
        assert "mean of" in caption and "range" in caption, caption

    # the seeds resume like any job: a rerun into the sweep keeps all eight
    again = run_sweep(["experiment=moe_grid", "model.top_k=1,2", "model.n_layers=1,2", "sweep.seeds=2", *TINY], sweep_dir)
    assert again.returncode == 0 and again.stdout.count("completed earlier, kept") == 8, _explain(again)


@pytest.mark.slow
@needs_chromium
def test_moe_grid_heatmap_is_drawn_in_a_real_browser(moe_grid, tmp_path):
    """experiment=moe_grid (2 x 2 here): the report's heatmaps, opened in headless Chromium, draw
    one coloured cell per job with its final validation loss printed in it."""
    sweep_dir, _ = moe_grid
    manifest = read_manifest(sweep_dir)
    page = (sweep_dir / "report.html").resolve()
    dom = chromium(page.as_uri(), tmp_path / "profile", "--dump-dom").stdout
    # the page's script found every heatmap cell laid out with a size and a fill
    figure = re.search(r'<figure id="heatmap_val_loss"[^>]*>', dom).group(0)
    assert 'data-cells-drawn="4"' in figure, figure[:300]
    assert 'data-heatmap-cells-drawn="12"' in dom  # three heatmaps of 2 x 2
    cells = json.loads(html_module.unescape(re.search(r'data-cells="([^"]+)"', figure).group(1)))
    by_config: dict[tuple[str, str], list[float]] = {}
    for job in manifest["jobs"]:
        by_config.setdefault((job_param(job, "model.top_k"), job_param(job, "model.n_layers")), []).append(job["final"]["val_loss"])
    rows, columns = ["1", "2"], ["1", "2"]  # top_k rows, n_layers columns, in value order
    for cell in cells:  # the mean of the config's two seeds, and their range
        seeds = by_config[(rows[cell["row"]], columns[cell["column"]])]
        assert cell["value"] == pytest.approx(sum(seeds) / 2) and (cell["low"], cell["high"]) == (min(seeds), max(seeds))
        # the value is printed in its cell (after its mark against the best config, if any), its range under it
        shown = f"{cell['mark']} {cell['text']}".strip()
        assert re.search(rf'id="heatmap_val_loss-value-{cell["row"]}-{cell["column"]}".*?>{re.escape(shown)}</text>', dom, re.S)
        assert re.search(rf'id="heatmap_val_loss-range-{cell["row"]}-{cell["column"]}".*?>[0-9.]+–[0-9.]+</text>', dom, re.S)

    # and the cells are on screen in their colours (the heatmaps come first on the page)
    shot = tmp_path / "shot.png"
    chromium(page.as_uri(), tmp_path / "profile", "--window-size=1280,1200", f"--screenshot={shot}")
    from PIL import Image

    pixels = list(getattr(Image.open(shot).convert("RGB"), "get_flattened_data", Image.open(shot).convert("RGB").getdata)())
    for cell in cells:
        want = tuple(int(cell["color"][i : i + 2], 16) for i in (1, 3, 5))
        area = sum(1 for p in pixels if all(abs(a - b) <= 3 for a, b in zip(p, want)))
        assert area > 1500, (cell, area)  # a cell is ~100 x 60 px


def job_param(job: dict, key: str) -> str:
    return next(o.split("=", 1)[1] for o in job["overrides"] if o.startswith(f"{key}="))


@pytest.mark.slow
def test_failing_job_does_not_stop_the_sweep(tmp_path):
    """Job order: two dense jobs where model.top_k does not apply (skipped), a job that fails in
    training (a torchtitan field set through the escape hatch to a dtype it does not know), then
    one that must still train."""
    sweep_dir = tmp_path / "sweep"
    args = ["model=tiny,tiny_moe", "model.top_k=1", "+titan.training.mixed_precision_param=bogus,float32", *TINY]
    result = run_sweep(["-m", *args], sweep_dir)
    assert result.returncode == 1, _explain(result)
    manifest = read_manifest(sweep_dir)
    assert manifest["counts"] == {"completed": 1, "failed": 1, "skipped": 2, "total": 4}
    jobs = {job["num"]: job for job in manifest["jobs"]}
    assert [jobs[n]["status"] for n in range(4)] == ["skipped", "skipped", "failed", "completed"]

    for n in (0, 1):
        assert jobs[n]["error_key"] == "model.top_k" and "dense flavor" in jobs[n]["reason"]
        assert not (Path(jobs[n]["run_dir"]) / "config.yaml").exists()
    failed = jobs[2]
    assert failed["overrides"] == ["model=tiny_moe", "model.top_k=1", "+titan.training.mixed_precision_param=bogus", *TINY]
    assert "bogus" in failed["error"] and Path(failed["log"]).is_file()
    assert "Traceback" in Path(failed["log"]).read_text()
    assert failed["rerun"].startswith("python -m qwen3_trn hydra.mode=RUN model=tiny_moe")
    assert manifest["rerun_failed"] == [failed["rerun"]]
    assert read_summary(Path(failed["run_dir"]))["status"] == "failed"
    # the failed job's wandb run is closed as failed, the next job's run is its own
    failed_run = read_offline_wandb_run(offline_wandb_files(Path(failed["run_dir"]))[0])
    assert failed_run.exit_code == 1
    assert_tracked_jobs(manifest)

    # the console summary: one line per job, skips and the failure with its log
    out = result.stdout
    assert re.search(r"#0 skipped .*does not apply: model.top_k", out)
    assert re.search(r"#2 FAILED .*bogus.*log: .*error.log", out)
    assert re.search(r"#3 completed .*loss", out)
    assert "1 of 4 jobs failed" in result.stderr
    html = (sweep_dir / "report.html").read_text()
    assert html.count("<tr data-run=") == 4 and 'data-status="failed"' in html and 'data-status="skipped"' in html

    # the summary can be printed again from the manifest, with the same exit status
    again = subprocess.run(
        [sys.executable, "-m", "qwen3_trn.sweeps", str(sweep_dir)],
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == 1 and "#2 FAILED" in again.stdout


@pytest.mark.slow
def test_every_mode_side_by_side(tmp_path):
    """experiment=modes sweeps every backend there is (conf/backend/): one job per registered
    mode, each tracked, on the same architecture, data and seed."""
    every_mode = sorted(BackendConfig.options)
    sweep_dir = tmp_path / "modes"
    result = run_sweep(["experiment=modes", *TINY], sweep_dir)
    assert result.returncode == 0, _explain(result)
    manifest = read_manifest(sweep_dir)
    assert manifest["counts"]["completed"] == len(every_mode) and manifest["swept_keys"] == ["backend"]
    modes = {job["num"]: next(o.split("=")[1] for o in job["overrides"] if o.startswith("backend=")) for job in manifest["jobs"]}
    assert sorted(modes.values()) == every_mode
    runs = assert_tracked_jobs(manifest, modes)
    assert sorted(run.job_type for run in runs) == every_mode
    # the same architecture, data and seed in every mode
    configs = [run.config for run in runs]
    for key in ("model", "data", "training"):
        assert all(c[key] == configs[0][key] for c in configs), key
    assert (sweep_dir / "report.html").read_text().count("<tr data-run=") == len(every_mode)


def test_sweep_over_a_missing_option_stops_before_any_job(tmp_path):
    sweep_dir = tmp_path / "bad"
    result = run_sweep(["-m", "backend=native,no_such_mode", *TINY], sweep_dir)
    assert result.returncode == 2
    assert "backend=no_such_mode: no such option in group 'backend'" in result.stderr and "native" in result.stderr
    assert not (sweep_dir / "0").exists()


def _earlier_slurm_section(job_id: str, state: str, run_dir: Path) -> dict:
    """The ``slurm`` section that summary.json and job.json held before the ``job`` section."""
    logs = [str(run_dir / "slurm" / f"{job_id}_0_log.out"), str(run_dir / "slurm" / f"{job_id}_0_log.err")]
    return {"job_id": job_id, "state": state, "folder": str(run_dir / "slurm"), "stdout": logs[0], "stderr": logs[1], "logs": logs}
