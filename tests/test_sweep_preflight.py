"""Sweeps through the project's sweeper (``qwen3_trn.sweeps.sweeper``): every job checked before any
starts, a planned sweep as one table, and a sweep directory that resumes (real multiruns)."""

from __future__ import annotations

import json
import signal
import time

import pytest

from qwen3_trn.results.records import read_job_record, read_manifest, read_metrics, read_summary
from tests.commands import command_in_process, start_command
from tests.secret_values import SECRETS_IN_LAUNCHER_ENV, files_with_secrets, secret_args

ONE_STEP = ["training.steps=1", "logger=none"]


@pytest.mark.slow
def test_a_sweep_with_an_invalid_job_starts_nothing(tmp_path):
    sweep = tmp_path / "sweep"
    result = command_in_process(["-m", "backend=nki_moe", "model=tiny_moe", "model.top_k=1,99,2", *ONE_STEP, f"hydra.sweep.dir={sweep}"])
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("error: 1 of 3 jobs of this sweep are invalid; nothing was started:")
    assert "#1 backend=nki_moe model=tiny_moe model.top_k=99" in result.stderr
    assert "model.top_k: top_k=99 is larger than num_experts=8" in result.stderr
    assert "sweep.skip_invalid=true" in result.stderr
    assert not sweep.exists(), "nothing is written before every job is valid"


@pytest.mark.parametrize(
    "seeds,why",
    [
        (["-m", "model.n_layers=1,2", "sweep.seeds=1,2"], "sweep.seeds: give one number of seeds (e.g. sweep.seeds=3), not a list."),
        (["-m", "model.n_layers=1,2", "sweep.seeds=0"], "sweep.seeds=0: give how many seeds each job runs with, 1 or more"),
        (
            ["-m", "model.n_layers=1,2", "sweep.seeds=2", "training.seed=1,2"],
            "training.seed: swept together with sweep.seeds=2; sweep the seeds one way",
        ),
        (["hparams_search=tiny_lr", "sweep.seeds=2"], "sweep.seeds: a search runs each trial once"),
    ],
)
def test_seeds_that_cannot_replicate_the_jobs_start_nothing(tmp_path, seeds, why):
    sweep = tmp_path / "sweep"
    result = command_in_process([*seeds, *ONE_STEP, f"hydra.sweep.dir={sweep}"])
    assert result.returncode == 2 and result.stderr.startswith(f"error: {why}"), result.stderr[-3000:]
    assert not sweep.exists()


@pytest.mark.slow
def test_a_rerun_with_more_seeds_runs_only_the_new_seeds(tmp_path):
    sweep = tmp_path / "sweep"
    args = ["-m", "debug=smoke", "training.steps=1", f"hydra.sweep.dir={sweep}"]
    first = command_in_process([*args, "sweep.seeds=2"])
    assert first.returncode == 0, first.stderr[-3000:]
    stamps = {n: (sweep / str(n) / "summary.json").stat().st_mtime_ns for n in (0, 1)}
    more = command_in_process([*args, "sweep.seeds=3"])
    assert more.returncode == 0, more.stderr[-3000:]
    assert more.stdout.count("completed earlier, kept") == 2 and "#2 completed training.seed=44" in more.stdout
    jobs = read_manifest(sweep)["jobs"]
    assert [(j["num"], j["name"], j["status"]) for j in jobs] == [(n, f"training.seed={42 + n}", "completed") for n in range(3)]
    assert {n: (sweep / str(n) / "summary.json").stat().st_mtime_ns for n in (0, 1)} == stamps  # not trained again
    assert read_summary(sweep / "2")["seed"] == 44


@pytest.mark.slow
def test_skip_invalid_runs_the_valid_jobs_and_a_rerun_trains_nothing_again(tmp_path):
    sweep = tmp_path / "sweep"
    args = ["-m", *ONE_STEP, "training.seed=1,2", "model.n_layers=2,0", "sweep.skip_invalid=true", f"hydra.sweep.dir={sweep}"]
    first = command_in_process(args)
    assert first.returncode == 0, first.stderr[-3000:]
    jobs = {job["num"]: job for job in read_manifest(sweep)["jobs"]}
    assert [jobs[n]["status"] for n in range(4)] == ["completed", "skipped", "completed", "skipped"]
    assert jobs[1]["invalid"] and "model.n_layers: must be >= 1, got 0" in jobs[1]["reason"]
    assert not (sweep / "1" / "metrics.jsonl").exists()
    trained = {n: (sweep / str(n) / "metrics.jsonl").read_bytes() for n in (0, 2)}
    stamps = {n: (sweep / str(n) / "summary.json").stat().st_mtime_ns for n in (0, 2)}

    again = command_in_process(args)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count("completed earlier, kept") == 2
    for n in (0, 2):  # nothing trained again: the runs' records are untouched
        assert (sweep / str(n) / "metrics.jsonl").read_bytes() == trained[n]
        assert (sweep / str(n) / "summary.json").stat().st_mtime_ns == stamps[n]
    assert read_manifest(sweep)["counts"] == {**read_manifest(sweep)["counts"], "completed": 2, "skipped": 2, "total": 4}
    assert json.loads((sweep / "sweep.json").read_text())["resumed"], "the sweep record says it was resumed"


@pytest.mark.slow
def test_a_planned_sweep_is_one_table_and_no_run_per_job(tmp_path):
    sweep = tmp_path / "sweep"
    result = command_in_process(
        ["-m", "mode=plan", "logger=none", "model=tiny,tiny_moe", "launcher.nproc_per_node=1,2", *secret_args(), f"hydra.sweep.dir={sweep}"]
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "planned sweep" in result.stdout
    for column in ("layout", "memory per rank", "fits", "TFLOP per step"):
        assert column in result.stdout
    assert sorted(p.name for p in sweep.iterdir()) == ["manifest.json", "multirun.yaml", "plan.txt", "sweep.json"]
    planned = read_manifest(sweep)
    assert planned["counts"]["planned"] == 4 and planned["planned"]
    assert [job["plan"]["world_size"] for job in planned["jobs"]] == [1, 2, 1, 2]
    plan = (sweep / "plan.txt").read_text()
    assert plan.count("=== job #") == 4 and "model.flavor: debugmodel -> debugmodel_moe" in plan
    assert files_with_secrets(sweep) == []
    assert not any(v in result.stdout + result.stderr for v in SECRETS_IN_LAUNCHER_ENV.values())


@pytest.mark.slow
def test_an_interrupted_sweep_resumes_its_job_from_the_checkpoint(tmp_path):
    """Ctrl-C while job 1 trains; the same command again keeps job 0, moves job 1's attempt
    aside and resumes it from its last complete checkpoint."""
    sweep = tmp_path / "sweep"
    args = [
        "-m",
        "logger=none",
        "validation=off",
        "training.steps=40",
        "training.seq_len=64",
        "checkpoint=on",
        "checkpoint.interval=2",
        "training.seed=1,2",
        f"hydra.sweep.dir={sweep}",
    ]
    process = start_command(args, text=False, start_new_session=False)
    deadline = time.time() + 600
    while not (sweep / "1" / "checkpoint" / "step-2" / ".metadata").is_file():
        assert process.poll() is None and time.time() < deadline, process.communicate()[1][-3000:]
        time.sleep(0.05)
    # Ctrl-C, pressed again if Python dropped the first (a KeyboardInterrupt raised inside a
    # finalizer is ignored), as a user would
    metrics = sweep / "1" / "metrics.jsonl"
    for _ in range(20):
        process.send_signal(signal.SIGINT)
        logged = len(metrics.read_text().splitlines()) if metrics.is_file() else 0
        time.sleep(3)
        if process.poll() is not None or len(metrics.read_text().splitlines()) == logged:
            break  # stopped training: the interrupt was taken
    _, err = process.communicate(timeout=300)
    assert process.returncode == 130, err.decode()[-3000:]
    assert read_job_record(sweep / "1")["status"] == "interrupted"
    job0 = (sweep / "0" / "metrics.jsonl").read_bytes()

    again = command_in_process(args)
    assert again.returncode == 0, again.stderr[-3000:]
    assert (sweep / "0" / "metrics.jsonl").read_bytes() == job0, "the completed job is kept"
    attempt = sweep / "previous-attempts" / "1-1"
    # the steps of its complete checkpoints (how far it got depends on when the Ctrl-C was taken;
    # the oldest ones are rotated out: checkpoint.keep_latest_k)
    complete = sorted(int(path.parent.name.split("-")[1]) for path in attempt.glob("checkpoint/step-*/.metadata"))
    assert complete, "the earlier attempt is kept, moved aside, with its checkpoints"
    summary = read_summary(sweep / "1")
    # resumed from the last complete one
    assert summary["status"] == "completed" and summary["resumed_from"] == str(attempt / "checkpoint" / f"step-{complete[-1]}")
    resumed_at = complete[-1]
    assert [r["step"] for r in read_metrics(sweep / "1")] == list(range(resumed_at + 1, 41))
    jobs = read_manifest(sweep)["jobs"]
    assert [job["status"] for job in jobs] == ["completed", "completed"]
    assert f"checkpoint.resume_from={attempt}" in jobs[1]["overrides"], "the job records where it resumed from"
