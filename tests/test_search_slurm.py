"""Searches on the two-host Slurm cluster of the tests (tests/slurm_cluster.py ``two_host_cluster``):
two trials in flight as two Slurm jobs (each submitted by a process of its own and followed by
the search, whatever ``n_concurrent``), their ranks reporting to the study from the compute
hosts, each pruned there; then the same command again, which resumes the study. The study in the
cluster's MariaDB server (a database and user of its own, a random password that no file of the
sweep holds), and in the journal file of the shared sweep directory (the default on Slurm).

The compute hosts are network namespaces: they reach the database server through its socket
file, as a host of a real cluster reaches its server's address. Skipped, with the reason, where
Slurm is not installed or the tests do not run as root.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
from pathlib import Path
from typing import Any, Callable

import optuna
import pytest
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

from qwen3_trn.results.records import read_metrics, read_summary
from tests.commands import command_in_process
from tests.slurm_cluster import SlurmCluster, two_host_cluster  # noqa: F401

try:
    import submitit
except ImportError:
    submitit = None

pytestmark = [pytest.mark.slow, pytest.mark.skipif(submitit is None, reason="submitit is not installed (pip install -e '.[slurm]')")]

STUDY = "tiny_lr"
# Two trials at once, each a one-rank Slurm job that validates at step 2, where the threshold
# pruner stops it (any loss above 1.0 is pruned once the pruner's 2 warm-up steps are over).
SEARCH = [
    "hparams_search=tiny_lr",
    "training.steps=8",
    "training.seq_len=64",
    "validation.interval=2",
    "validation.steps=1",
    "launcher=slurm",
    "launcher.partition=cpu",
    "hydra.sweeper.n_concurrent=2",
    "hydra.sweeper.pruner.name=threshold",
    "+hydra.sweeper.pruner.upper=1.0",
    "~hydra.sweeper.pruner.n_startup_trials",
]


def _explain(result: subprocess.CompletedProcess) -> str:
    return f"exit {result.returncode}\nstdout:\n{result.stdout[-6000:]}\nstderr:\n{result.stderr[-4000:]}"


def _mariadb(cluster: SlurmCluster, sql: str) -> None:
    socket = cluster.state_dir / "mysql" / "mysqld.sock"
    cluster.run("mariadb", "--no-defaults", f"--socket={socket}", "-uroot", "-e", sql)


@pytest.fixture(scope="module")
def study_database(two_host_cluster: SlurmCluster):
    """A database and a user of their own in the cluster's MariaDB server (the one slurmdbd keeps
    its accounting in): the storage URL with the user's random password, and the password."""
    name, password = f"optuna_{secrets.token_hex(4)}", secrets.token_urlsafe(24)
    _mariadb(
        two_host_cluster,
        f"CREATE DATABASE {name}; CREATE USER '{name}'@'localhost' IDENTIFIED BY '{password}'; "
        f"GRANT ALL PRIVILEGES ON {name}.* TO '{name}'@'localhost';",
    )
    socket = two_host_cluster.state_dir / "mysql" / "mysqld.sock"
    yield f"mysql+pymysql://{name}:{password}@localhost/{name}?unix_socket={socket}", password
    _mariadb(two_host_cluster, f"DROP DATABASE {name}; DROP USER '{name}'@'localhost';")


def _search(cluster: SlurmCluster, sweep_dir: Path, n_trials: int, *extra: str) -> subprocess.CompletedProcess:
    result = command_in_process([*SEARCH, f"hydra.sweeper.n_trials={n_trials}", *extra, f"hydra.sweep.dir={sweep_dir}"], env=cluster.env)
    assert result.returncode == 0, _explain(result)
    return result


def _jobs(sweep_dir: Path) -> dict[int, dict]:
    return {job["num"]: job for job in json.loads((sweep_dir / "manifest.json").read_text())["jobs"]}


def _every_trial_pruned_once(cluster: SlurmCluster, sweep_dir: Path, storage: Any, n_trials: int) -> None:
    """Every trial of the study once, pruned at step 2 on a compute host in a Slurm job of its own."""
    trials = optuna.load_study(study_name=STUDY, storage=storage).trials
    assert [(t.number, t.state) for t in trials] == [(n, TrialState.PRUNED) for n in range(n_trials)]
    jobs = _jobs(sweep_dir)
    assert sorted(jobs) == list(range(n_trials)) and len({job["job"]["id"] for job in jobs.values()}) == n_trials
    for num, job in jobs.items():
        summary = read_summary(Path(job["run_dir"]))
        assert job["status"] == summary["status"] == "pruned" and summary["pruned"]["step"] == 2, summary
        assert set(summary["job"]["hostnames"]) <= set(cluster.nodes), summary["job"]
        # told the wall times of its Slurm job, not of its submission
        assert job["job"]["submitted"] < job["started"] == job["job"]["started"] < job["ended"] == job["job"]["ended"], job
        assert (trials[num].user_attrs["started"], trials[num].user_attrs["ended"]) == (job["started"], job["ended"])
        assert [r["step"] for r in read_metrics(Path(job["run_dir"]))] == [1, 2]


def _search_twice(cluster: SlurmCluster, sweep_dir: Path, storage: Callable[[], Any], *extra: str) -> list[subprocess.CompletedProcess]:
    """Two trials at once, then the same command with three: the study resumed, every trial in it
    once. ``storage()`` opens the study's storage."""
    first = _search(cluster, sweep_dir, 2, "launcher.wait=true", *extra)
    _every_trial_pruned_once(cluster, sweep_dir, storage(), 2)
    # both trials in flight at once: the second asked before the first was told its end (whether
    # Slurm ran the two jobs at the same time is the cluster's business)
    trials = optuna.load_study(study_name=STUDY, storage=storage()).trials
    first_told = min(t.datetime_complete for t in trials)
    assert all(t.datetime_start < first_told for t in trials), [(t.datetime_start, t.datetime_complete) for t in trials]

    second = _search(cluster, sweep_dir, 3, "launcher.wait=true", *extra)
    assert f"study {STUDY} resumed" in second.stdout and second.stdout.count("[search] trial ") == 1, _explain(second)
    _every_trial_pruned_once(cluster, sweep_dir, storage(), 3)
    return [first, second]


def test_a_concurrent_search_on_slurm_keeps_its_study_in_a_mariadb_server(two_host_cluster, study_database, tmp_path):
    url, password = study_database
    sweep_dir = tmp_path / "sweep"
    results = _search_twice(two_host_cluster, sweep_dir, lambda: url, f"hydra.sweeper.storage='{url}'")
    assert not (sweep_dir / "optuna.db").exists() and not (sweep_dir / "optuna.journal").exists()
    # the password is in no file of the sweep, and was never printed
    holding = [str(path) for path in sweep_dir.rglob("*") if path.is_file() and password.encode() in path.read_bytes()]
    assert not holding, holding
    for result in results:
        assert password not in result.stdout and password not in result.stderr
    public = url.partition("?")[0].replace(f":{password}@", "@")  # the trials' storage: the URL without its password
    assert f"dashboard: optuna-dashboard {public}?unix_socket=" in results[1].stdout
    config = (sweep_dir / "0" / "config.yaml").read_text()
    assert f"storage: {public}?unix_socket=" in config, config


def test_a_concurrent_search_on_slurm_keeps_its_study_in_a_journal_by_default(two_host_cluster, tmp_path):
    """launcher.wait=false: the command submits two trials and returns; the same command with
    launcher.wait=true and three trials settles those two (or follows them to their end) and runs the third. The
    study is in the journal file of the sweep directory, which the compute hosts share."""
    sweep_dir = tmp_path / "sweep"
    journal = sweep_dir / "optuna.journal"

    def storage() -> JournalStorage:
        return JournalStorage(JournalFileBackend(str(journal)))

    first = _search(two_host_cluster, sweep_dir, 3, "launcher.wait=false")
    trials = optuna.load_study(study_name=STUDY, storage=storage()).trials
    assert [(t.number, t.state) for t in trials] == [(0, TrialState.RUNNING), (1, TrialState.RUNNING)], _explain(first)
    assert "2 trial(s) still in flight elsewhere" in first.stdout, _explain(first)

    second = _search(two_host_cluster, sweep_dir, 3, "launcher.wait=true")
    assert f"study {STUDY} resumed" in second.stdout, _explain(second)
    # the two earlier trials settled (ended by now) or followed to their end (still in flight); only the third started
    assert "[search] trial 0/3:" not in second.stdout and second.stdout.count("[search] trial 2/3:") == 1, _explain(second)
    _every_trial_pruned_once(two_host_cluster, sweep_dir, storage(), 3)
    assert not (sweep_dir / "optuna.db").exists() and os.path.getsize(journal) > 0
