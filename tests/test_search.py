"""Hyperparameter searches (``hparams_search=...``, ``qwen3_trn.search``): real Optuna studies of
real ``model=tiny`` trials on the CPU, pruned on their validation losses, resumed from their
SQLite storage, reported (search.html, best.yaml) and opened in optuna-dashboard."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from qwen3_trn.records import read_metrics, read_summary
from tests.commands import command_in_process, command_in_subprocess
from tests.conftest import chromium, needs_chromium
from tests.slurm_cluster import slurm_cluster  # noqa: F401

STEPS = 8
# Short trials that validate every other step, so that the pruner has intermediate values.
SHORT = [f"training.steps={STEPS}", "training.seq_len=64", "validation.interval=2", "validation.steps=1"]
STUDY = "tiny_lr"


def _explain(result: subprocess.CompletedProcess) -> str:
    return f"exit {result.returncode}\nstdout:\n{result.stdout[-5000:]}\nstderr:\n{result.stderr[-5000:]}"


def run_search(sweep_dir: Path, n_trials: int, *extra: str) -> subprocess.CompletedProcess:
    """The search through the command's entry point in this process (the search on Slurm below
    is a real ``python -m qwen3_trn`` process)."""
    args = ["hparams_search=tiny_lr", f"hydra.sweeper.n_trials={n_trials}", *SHORT, *extra, f"hydra.sweep.dir={sweep_dir}"]
    return command_in_process(args)


def load_study(sweep_dir: Path, name: str = STUDY) -> optuna.Study:
    return optuna.load_study(study_name=name, storage=f"sqlite:///{sweep_dir / 'optuna.db'}")


def jobs_by_num(sweep_dir: Path) -> dict[int, dict]:
    return {job["num"]: job for job in json.loads((sweep_dir / "manifest.json").read_text())["jobs"]}


@pytest.fixture(scope="module")
def search(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess, dict]:
    """A 6-trial search (median pruner after 2 completed trials), then the same command with
    n_trials=8 into the same sweep directory: it resumes the study."""
    sweep_dir = tmp_path_factory.mktemp("search") / "sweep"
    first = run_search(sweep_dir, 6)
    assert first.returncode == 0, _explain(first)
    before = {
        "trials": [(t.number, t.state, t.value, t.params) for t in load_study(sweep_dir).trials],
        "manifest": json.loads((sweep_dir / "manifest.json").read_text()),
        "best": yaml.safe_load((sweep_dir / "best.yaml").read_text()),
        "html": (sweep_dir / "search.html").read_text(),
        "started": {num: job["started"] for num, job in jobs_by_num(sweep_dir).items()},
    }
    return sweep_dir, first, before


def test_search_prunes_and_writes_the_best_config(search):
    sweep_dir, first, before = search
    trials = before["trials"]
    assert [t[0] for t in trials] == list(range(6))
    jobs = {job["num"]: job for job in before["manifest"]["jobs"]}
    assert sorted(jobs) == list(range(6))  # every trial is a job of the sweep, numbered as its trial

    pruned = [number for number, state, _, _ in trials if state == TrialState.PRUNED]
    complete = {number: value for number, state, value, _ in trials if state == TrialState.COMPLETE}
    assert pruned, f"no trial was pruned: {trials}\n{_explain(first)}"
    assert len(complete) >= 2  # the median pruner's startup trials ran to their end
    assert before["manifest"]["counts"]["pruned"] == len(pruned) and before["manifest"]["counts"]["failed"] == 0
    assert before["manifest"]["search"] == {"report": str(sweep_dir / "search.html"), "best": str(sweep_dir / "best.yaml")}
    assert f"search:   {sweep_dir / 'search.html'}" in first.stdout
    # the comparison report compares the searched parameters, not how each job found its trial
    assert before["manifest"]["swept_keys"] == ["optimizer.lr", "optimizer.warmup_steps", "optimizer.weight_decay"]
    assert "sweep.trial" not in (sweep_dir / "report.md").read_text().split("Swept keys:")[1].splitlines()[0]
    for number in pruned:
        job = jobs[number]
        run_dir = Path(job["run_dir"])
        summary = read_summary(run_dir)
        assert job["status"] == summary["status"] == "pruned", (job, summary)
        assert "error" not in summary and not (run_dir / "error.log").exists()  # a pruned run is no failure
        records = read_metrics(run_dir)
        last = records[-1]["step"]
        assert last < STEPS  # stopped early, at the validation whose loss the pruner judged
        assert summary["pruned"]["step"] == last and records[-1]["val_loss"] == pytest.approx(summary["pruned"]["val_loss"])
        assert f"#{number} pruned" in first.stdout
    for number, value in complete.items():
        job = jobs[number]
        summary = read_summary(Path(job["run_dir"]))
        assert job["status"] == summary["status"] == "completed"
        assert [r["step"] for r in read_metrics(Path(job["run_dir"]))][-1] == STEPS
        assert value == pytest.approx(summary["val_loss"]) == pytest.approx(job["final"]["val_loss"])  # the final validation loss

    # best.yaml: the completed trial of least final validation loss, its overrides and config
    best = before["best"]
    best_number = min(complete, key=complete.get)
    assert best["trial"] == best_number and best["value"] == pytest.approx(min(complete.values()))
    assert best["study"] == STUDY and best["direction"] == "minimize"
    assert set(best["params"]) == {"optimizer.lr", "optimizer.warmup_steps", "optimizer.weight_decay"}
    assert f"optimizer.lr={best['params']['optimizer.lr']!r}" in best["overrides"]
    assert not any(o.startswith("sweep.trial.") for o in best["overrides"])
    assert best["config"]["optimizer"]["lr"] == pytest.approx(best["params"]["optimizer.lr"])
    assert best["config"]["training"]["steps"] == STEPS and best["run_dir"] == jobs[best_number]["run_dir"]

    # search.html: a validation-loss line per trial, the pruned ones marked; the best trial; importances
    html = before["html"]
    for number in pruned:
        assert f'id="search-loss-trial-{number}-pruned"' in html
        assert f'<tr id="trial-{number}" class="pruned">' in html
    for number in complete:
        assert f'id="search-loss-trial-{number}"' in html
    assert f"Best trial: {best_number} " in html
    # sampled values to a few significant digits, run directories relative to the sweep
    study = load_study(sweep_dir)
    for trial in study.trials:
        row = re.search(rf'<tr id="trial-{trial.number}"[^>]*>(.*?)</tr>', html).group(1)
        assert f"<td>{trial.params['optimizer.lr']:.4g}</td>" in row and row.endswith(f"<td>{trial.number}</td>"), row
    assert f"<td>{sweep_dir}" not in html
    # importances from 2-3 completed trials would be noise: withheld, and the page says why
    assert "<h2 id='importances'>" in html and "Parameter importances are withheld until 10 trials have completed" in html


@needs_chromium
def test_the_search_report_opens_in_a_real_browser(search, tmp_path):
    sweep_dir, _, _ = search
    shot = tmp_path / "search.png"
    page = (sweep_dir / "search.html").resolve().as_uri()
    dom = chromium(page, tmp_path / "profile", "--dump-dom").stdout
    assert dom.count('<tr id="trial-') == len(load_study(sweep_dir).trials) and 'id="search-loss-trial-' in dom
    chromium(page, tmp_path / "profile", "--window-size=1200,1400", f"--screenshot={shot}")
    from PIL import Image

    assert Image.open(shot).size == (1200, 1400)


def test_importances_say_what_they_rest_on():
    from optuna.distributions import FloatDistribution
    from optuna.trial import create_trial

    from qwen3_trn.report.search import MIN_TRIALS_FOR_IMPORTANCES, importances

    space = {"optimizer.lr": FloatDistribution(1e-4, 1.0, log=True), "optimizer.weight_decay": FloatDistribution(0.0, 0.1)}
    study = optuna.create_study()
    for n in range(MIN_TRIALS_FOR_IMPORTANCES):
        if n == 2:
            weights, basis = importances(study)
            assert weights == {} and "(this search has 2)" in basis
        lr, wd = 10 ** (-4 + 4 * n / MIN_TRIALS_FOR_IMPORTANCES), 0.01 * (n % 3)
        study.add_trial(create_trial(params={"optimizer.lr": lr, "optimizer.weight_decay": wd}, distributions=space, value=7 - lr))
    weights, basis = importances(study)
    assert set(weights) == set(space) and sum(weights.values()) == pytest.approx(1.0)
    assert basis.startswith(f"From {MIN_TRIALS_FOR_IMPORTANCES} completed trials")


def test_search_resumes_its_study(search):
    sweep_dir, _, before = search
    second = run_search(sweep_dir, 8)
    assert second.returncode == 0, _explain(second)
    assert f"study {STUDY} resumed" in second.stdout
    trials = load_study(sweep_dir).trials
    assert len(trials) == 8
    # the six earlier trials are kept as they were; only two new ones ran
    assert [(t.number, t.state, t.value, t.params) for t in trials[:6]] == before["trials"]
    assert all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials[6:])
    jobs = jobs_by_num(sweep_dir)
    assert sorted(jobs) == list(range(8))
    assert {num: jobs[num]["started"] for num in range(6)} == before["started"]
    assert second.stdout.count("Launching 1 jobs locally") == 2 or second.stdout.count("[search] trial ") == 2
    best = yaml.safe_load((sweep_dir / "best.yaml").read_text())
    values = [t.value for t in trials if t.state == TrialState.COMPLETE]
    assert best["value"] == pytest.approx(min(values))


def test_an_invalid_trial_is_told_failed_and_not_started(tmp_path):
    """Every sampled config here has no layers: preflight refuses it, the study is told failed,
    nothing trains, and the sweep records the trials as skipped (invalid)."""
    sweep_dir = tmp_path / "sweep"
    result = run_search(sweep_dir, 2, "model.n_layers=choice(0,-1)")
    assert result.returncode == 0, _explain(result)
    trials = load_study(sweep_dir).trials
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.FAIL]
    assert all("model.n_layers" in t.user_attrs["invalid"] for t in trials)
    for job in jobs_by_num(sweep_dir).values():
        assert job["status"] == "skipped" and job["invalid"] and job["error_key"] == "model.n_layers"
        assert not (Path(job["run_dir"]) / "metrics.jsonl").exists()
    assert "Launching" not in result.stdout
    assert not (sweep_dir / "best.yaml").exists()
    assert "No trial has completed yet" in (sweep_dir / "search.html").read_text()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@needs_chromium
def test_the_study_opens_in_optuna_dashboard(search, tmp_path):
    sweep_dir = search[0]
    dashboard = shutil.which("optuna-dashboard", path=str(Path(sys.executable).parent)) or shutil.which("optuna-dashboard")
    assert dashboard, "optuna-dashboard is in the test extra"
    port = _free_port()
    server = subprocess.Popen(
        [dashboard, f"sqlite:///{sweep_dir / 'optuna.db'}", "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}/dashboard/"
        for _ in range(120):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies", timeout=2) as response:
                    studies = json.loads(response.read())
                break
            except OSError:
                assert server.poll() is None, server.stderr.read()
                time.sleep(0.5)
        else:
            pytest.fail("optuna-dashboard did not answer")
        assert [s["study_name"] for s in studies["study_summaries"]] == [STUDY]
        dom = chromium(url, tmp_path / "profile", "--dump-dom").stdout
        assert STUDY in dom
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_a_two_rank_trial_is_pruned_on_every_rank(tmp_path):
    """Ranks in their own processes (FSDP over two CPU ranks): the metrics rank's decision
    reaches the other rank at the same validation, both stop, and the run is pruned, not failed."""
    sweep_dir = tmp_path / "sweep"
    result = run_search(
        sweep_dir,
        1,
        "parallelism=fsdp",
        "device=cpu",
        "launcher.nproc_per_node=2",
        # any validation loss above 1.0 is pruned once the pruner's warm-up (2 steps) is over
        "hydra.sweeper.pruner.name=threshold",
        "+hydra.sweeper.pruner.upper=1.0",
        "~hydra.sweeper.pruner.n_startup_trials",
    )
    assert result.returncode == 0, _explain(result)
    assert [t.state for t in load_study(sweep_dir).trials] == [TrialState.PRUNED]
    job = jobs_by_num(sweep_dir)[0]
    run_dir = Path(job["run_dir"])
    summary = read_summary(run_dir)
    assert job["status"] == summary["status"] == "pruned" and summary["world_size"] == 2
    assert "error" not in job and "error" not in summary and not (run_dir / "error.log").exists()
    assert summary["pruned"]["step"] == 2 and [r["step"] for r in read_metrics(run_dir)] == [1, 2]
    for rank in (0, 1):  # each rank validated at step 2 and trained no further
        log = (run_dir / "logs" / f"rank{rank}.log").read_text()
        assert "validate step:  2" in log and "step:  3" not in log


def test_a_search_on_slurm_prunes_its_trial_on_the_node(slurm_cluster, tmp_path):
    """launcher=slurm launcher.wait=true: each trial is a Slurm job; its ranks report to the
    study's SQLite storage from the node, the pruner stops it there, and the search learns its
    outcome before asking the next trial."""
    sweep_dir = tmp_path / "sweep"
    args = [
        "hparams_search=tiny_lr",
        "hydra.sweeper.n_trials=1",
        *SHORT,
        "launcher=slurm",
        "launcher.partition=cpu",
        "launcher.wait=true",
        "hydra.sweeper.pruner.name=threshold",
        "+hydra.sweeper.pruner.upper=1.0",
        "~hydra.sweeper.pruner.n_startup_trials",
        f"hydra.sweep.dir={sweep_dir}",
    ]
    result = command_in_subprocess(args, timeout=600, env=slurm_cluster.env)
    assert result.returncode == 0, _explain(result)
    assert [t.state for t in load_study(sweep_dir).trials] == [TrialState.PRUNED]
    job = jobs_by_num(sweep_dir)[0]
    assert job["status"] == "pruned" and job["job"]["id"], job
    assert [r["step"] for r in read_metrics(Path(job["run_dir"]))] == [1, 2]
    summary = read_summary(Path(job["run_dir"]))
    assert summary["status"] == "pruned" and summary["pruned"]["step"] == 2, summary
