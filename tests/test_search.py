"""Hyperparameter searches (``hparams_search=...``, ``qwen3_trn.sweeps.search``): real Optuna studies of
real ``model=tiny`` trials on the CPU, pruned on their validation losses, resumed from their
SQLite storage, reported (search.html, best.yaml) and opened in optuna-dashboard."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

from qwen3_trn.results.records import read_metrics, read_summary
from tests.commands import cli_env, command_in_process
from tests.conftest import REPO, chromium, needs_chromium

STEPS = 8
# Short trials that validate every other step, so that the pruner has intermediate values.
SHORT = [f"training.steps={STEPS}", "training.seq_len=64", "validation.interval=2", "validation.steps=1"]
STUDY = "tiny_lr"


def _explain(result: subprocess.CompletedProcess) -> str:
    return f"exit {result.returncode}\nstdout:\n{result.stdout[-5000:]}\nstderr:\n{result.stderr[-5000:]}"


def run_search(sweep_dir: Path, n_trials: int, *extra: str) -> subprocess.CompletedProcess:
    """The search through the command's entry point in this process (the concurrent searches
    below, and those on Slurm in tests/test_search_slurm.py, are real ``python -m qwen3_trn``
    processes)."""
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


# --- the trials over wall time (search.html's timeline, search.md's start and end columns) ---

TIMELINE_BAR = re.compile(r'<g id="search-timeline-trial-(\d+)-(\w+)">\s*<path d="([^"]+)"')


def _timeline_bars(html: str) -> dict[int, tuple[str, float, float]]:
    """Each bar of the timeline as drawn: its trial's state and its left and right edge (SVG x)."""
    bars = {}
    for number, state, path in TIMELINE_BAR.findall(html):
        xs = [float(x) for x in re.findall(r"[ML] ([\d.]+) [\d.]+", path)]
        bars[int(number)] = (state, min(xs), max(xs))
    return bars


def _md_times(md: str) -> dict[int, tuple[float, float | None]]:
    """Each trial's start and end as search.md's table of trials writes them (running: no end)."""
    lines = [line for line in md.splitlines() if line.startswith("| ")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    start, end = header.index("start (s)"), header.index("end (s)")
    times = {}
    for line in lines[1:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[start]:
            times[int(cells[0])] = (float(cells[start].replace(",", "")), float(cells[end].replace(",", "")) if cells[end] else None)
    return times


def _overlapping(spans: dict[int, tuple[float, float]]) -> set[tuple[int, int]]:
    return {(a, b) for a in spans for b in spans if a < b and spans[a][0] < spans[b][1] and spans[b][0] < spans[a][1]}


def _run_trials(study: optuna.Study, concurrent: bool) -> None:
    """Real trials of a real study, asked and told as a search does: one at a time, or two in
    flight with the next asked when one ends (trial 0 pruned at step 2, trial 3 left running)."""
    from optuna.distributions import FloatDistribution

    space = {"optimizer.lr": FloatDistribution(1e-4, 1.0, log=True)}
    pause = 0.3  # long enough to tell apart in search.md's tenths of a second
    first = study.ask(space)
    second = study.ask(space) if concurrent else None
    first.report(7.0, 2)
    time.sleep(pause)
    study.tell(first, state=TrialState.PRUNED)
    second = second or study.ask(space)
    third = study.ask(space) if concurrent else None
    time.sleep(pause)
    study.tell(second, 6.0)
    third = third or study.ask(space)
    time.sleep(pause)
    study.tell(third, 5.0)
    study.ask(space)


@pytest.mark.parametrize("concurrent", [True, False], ids=["two-at-once", "one-at-a-time"])
def test_the_timeline_shows_which_trials_ran_at_once(tmp_path, concurrent):
    from qwen3_trn.report.search import write_search_report

    sweep_dir = tmp_path / "sweep"
    study = optuna.create_study(study_name="timeline", storage=f"sqlite:///{tmp_path / 'optuna.db'}")
    _run_trials(study, concurrent)
    write_search_report(study, sweep_dir, {}, " ".join)
    html, md = (sweep_dir / "search.html").read_text(), (sweep_dir / "search.md").read_text()

    # the trials' own asked and told times, as Optuna recorded them
    recorded = {t.number: (t.datetime_start, t.datetime_complete or t.datetime_start) for t in study.trials}
    expected = _overlapping(recorded)
    assert expected == ({(0, 1), (1, 2)} if concurrent else set())

    bars = _timeline_bars(html)
    assert {n: state for n, (state, _, _) in bars.items()} == {0: "pruned", 1: "complete", 2: "complete", 3: "running"}
    assert _overlapping({n: (left, right) for n, (_, left, right) in bars.items() if n < 3}) == expected
    assert "step 2</text>" in html.split('id="search-timeline-trial-0-pruned"')[1]  # where the pruned trial stopped

    times = _md_times(md)
    assert times[3][1] is None  # still running: no end
    assert _overlapping({n: span for n, span in times.items() if n < 3}) == expected
    assert all(times[n][1] > times[n][0] for n in range(3))
    at_once = f"at most {2 if concurrent else 1} at once"
    assert at_once in md and at_once in html


def test_a_one_at_a_time_search_shows_no_overlap(search):
    """The real sequential search: each trial asked after the one before was told."""
    sweep_dir = search[0]
    times = _md_times((sweep_dir / "search.md").read_text())
    assert sorted(times) == [t.number for t in load_study(sweep_dir).trials]
    assert _overlapping(times) == set()
    bars = _timeline_bars((sweep_dir / "search.html").read_text())
    assert _overlapping({n: (left, right) for n, (_, left, right) in bars.items()}) == set()
    assert "at most 1 at once" in (sweep_dir / "search.md").read_text()


# Two trials at once on this machine: the search packs each onto one core.
CONCURRENT = ["hparams_search=tiny_lr", "hydra.sweeper.n_concurrent=2", *SHORT]


def overlapping(jobs: dict[int, dict]) -> list[tuple[int, int]]:
    """The pairs of jobs whose recorded wall times (started .. ended) overlap."""
    nums = sorted(jobs)
    return [
        (a, b)
        for i, a in enumerate(nums)
        for b in nums[i + 1 :]
        if max(jobs[a]["started"], jobs[b]["started"]) < min(jobs[a]["ended"], jobs[b]["ended"])
    ]


def _wait_for(condition, timeout: float, what: str, process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert process.poll() is None, f"the search ended ({process.returncode}) before {what}:\n{log.read_text()[-4000:]}"
        assert time.monotonic() < deadline, f"no {what} after {timeout} s:\n{log.read_text()[-4000:]}"
        time.sleep(0.5)


def _gone(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _start_search(args: list[str], log: Path) -> subprocess.Popen:
    with log.open("w") as out:
        return subprocess.Popen([sys.executable, "-m", "qwen3_trn", *args], cwd=REPO, env=cli_env(), stdout=out, stderr=subprocess.STDOUT)


def _training(sweep_dir: Path, num: int) -> bool:
    metrics = sweep_dir / str(num) / "metrics.jsonl"
    return metrics.is_file() and bool(metrics.read_text().strip())


def _journal_study(journal: Path) -> optuna.Study:
    return optuna.load_study(study_name=STUDY, storage=JournalStorage(JournalFileBackend(str(journal))))


def test_a_trial_whose_process_is_lost_reads_as_failed_and_the_search_goes_on(tmp_path):
    """SIGKILL to one of two concurrent trials while it trains: nothing of it records an end; the
    search reads it as died, tells it failed, and asks the next trial while the other still runs.
    The study in a journal file (hydra.sweeper.storage=<path>; the Ctrl-C test below: SQLite),
    which holds every trial once."""
    sweep_dir = tmp_path / "sweep"
    journal = tmp_path / "study.journal"
    log = tmp_path / "search.log"
    search = _start_search(
        [
            *CONCURRENT,
            f"hydra.sweeper.storage={journal}",
            "training.steps=100",
            "validation.interval=50",
            "hydra.sweeper.n_trials=3",
            f"hydra.sweep.dir={sweep_dir}",
        ],
        log,
    )
    try:
        _wait_for(lambda: _training(sweep_dir, 0) and _training(sweep_dir, 1), 300, "two trials training", search, log)
        os.killpg(read_summary(sweep_dir / "0")["process"]["pid"], signal.SIGKILL)
        search.wait(timeout=600)
    finally:
        if search.poll() is None:
            search.kill()
    trials = _journal_study(journal).trials
    assert [t.number for t in trials] == [0, 1, 2], log.read_text()[-4000:]
    assert not (sweep_dir / "optuna.db").exists()
    assert trials[0].state == TrialState.FAIL and all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials[1:])
    jobs = jobs_by_num(sweep_dir)
    assert jobs[0]["status"] == "died" and read_summary(sweep_dir / "0")["status"] == "died", jobs[0]
    assert search.returncode == 1 and "0 of 3 jobs failed, 1 died" in log.read_text(), log.read_text()[-4000:]


def test_ctrl_c_stops_a_concurrent_search_and_a_rerun_goes_on(tmp_path):
    """SIGINT to the search command while two trials train: both are interrupted (their process
    groups stopped, nothing left running) and told failed; the same command again resumes the
    study with two more trials, in flight at once on a core each (packed), and every trial is in
    it once, told with its job's wall times."""
    sweep_dir = tmp_path / "sweep"
    args = [*CONCURRENT, "training.steps=100", "validation.interval=50", "hydra.sweeper.n_trials=3", f"hydra.sweep.dir={sweep_dir}"]
    log = tmp_path / "search.log"
    search = _start_search(args, log)
    try:
        _wait_for(lambda: _training(sweep_dir, 0) and _training(sweep_dir, 1), 300, "two trials training", search, log)
        search.send_signal(signal.SIGINT)
        assert search.wait(timeout=120) == 130, log.read_text()[-4000:]
    finally:
        if search.poll() is None:
            search.kill()
    trials = load_study(sweep_dir).trials
    assert [(t.number, t.state) for t in trials] == [(0, TrialState.FAIL), (1, TrialState.FAIL)], log.read_text()[-4000:]
    for num in (0, 1):
        job = json.loads((sweep_dir / str(num) / "job.json").read_text())
        assert job["status"] == "interrupted", job
        summary = read_summary(sweep_dir / str(num))
        assert summary["status"] == "interrupted" and _gone(summary["process"]["pid"]), f"trial {num}'s process group is still there"
    assert (sweep_dir / "2").exists() is False

    rerun = command_in_process([*args[:-2], "hydra.sweeper.n_trials=4", f"hydra.sweep.dir={sweep_dir}"])
    assert rerun.returncode == 0, _explain(rerun)
    assert f"study {STUDY} resumed" in rerun.stdout
    trials = load_study(sweep_dir).trials
    assert [t.number for t in trials] == [0, 1, 2, 3] and [t.state for t in trials[:2]] == [TrialState.FAIL] * 2
    assert all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials[2:]), [t.state for t in trials]
    assert sorted(jobs_by_num(sweep_dir)) == [0, 1, 2, 3]
    assert rerun.stdout.count("[search] trial ") == 2
    jobs = {num: json.loads((sweep_dir / str(num) / "job.json").read_text()) for num in (2, 3)}
    assert all(job["status"] in ("completed", "pruned") for job in jobs.values()), jobs
    assert overlapping(jobs) == [(2, 3)], {num: (job["started"], job["ended"]) for num, job in jobs.items()}
    slices = [json.loads((sweep_dir / str(num) / "device_slice.json").read_text())["slots"] for num in (2, 3)]
    assert len(slices[0]) == len(slices[1]) == 1 and slices[0] != slices[1], slices  # a core each
    for trial in trials[2:]:  # its job's wall times, as told
        assert (trial.user_attrs["started"], trial.user_attrs["ended"]) == (jobs[trial.number]["started"], jobs[trial.number]["ended"])
    assert "launcher.devices_per_job=1" in jobs[2]["overrides"]
