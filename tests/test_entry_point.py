"""The command's entry point around Hydra: Hydra's own flags (``--cfg job|hydra|all`` with and
without ``--resolve``, ``--info``, ``--help``, ``--hydra-help``) and the run and sweep
directories Hydra creates, refused before it does when they cannot be written.

They run through the real entry point (``qwen3_trn.__main__.main``, Hydra's ``@hydra.main``) in
this process: each is Hydra's argument handling, which a subprocess per case would only repeat
(``tests/test_errors.py`` runs the command for real). The exception: what the command answers
without running anything is answered without importing torch, torchtitan or transformers, which
only a fresh process shows.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from tests.commands import REPO, cli_env, command_in_process

FLAGS = {
    "cfg-job": (["--cfg", "job"], "output_dir"),
    "cfg-job-resolve": (["--cfg", "job", "--resolve"], "output_dir"),
    "cfg-hydra": (["--cfg", "hydra"], "hydra"),
    "cfg-hydra-resolve": (["--cfg", "hydra", "--resolve"], "hydra"),
    "cfg-all": (["--cfg", "all"], "hydra"),
    "cfg-all-resolve": (["--cfg", "all", "--resolve"], "hydra"),
    "cfg-job-with-overrides": (["--cfg", "job", "--resolve", "backend=nki_moe", "training.steps=1"], "output_dir"),
}


@pytest.mark.parametrize("case", list(FLAGS), ids=list(FLAGS))
def test_cfg_prints_the_config(case, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    args, top_key = FLAGS[case]
    done = command_in_process(args)
    code, out, err = done.returncode, done.stdout, done.stderr
    assert code == 0, err[-3000:]
    printed = yaml.safe_load(out)
    assert top_key in printed, out[:2000]
    if top_key == "output_dir":
        assert printed["training"]["steps"] == (1 if "training.steps=1" in args else 40)
        assert printed["backend"]["name"] == ("nki_moe" if "backend=nki_moe" in args else "native")
        if "--resolve" in args:
            assert "${" not in out
    assert not list(tmp_path.iterdir()), "printing the config writes nothing"


@pytest.mark.parametrize(
    "args,needles",
    [
        (["--info"], ["Config search path", "Defaults List", "backend: native"]),
        (["--help"], ["== Configuration groups ==", "backend: hf_v5, native, nki_moe", "model:"]),
        (["--hydra-help"], ["Hydra (", "--multirun"]),
    ],
    ids=["info", "help", "hydra-help"],
)
def test_info_and_help(args, needles, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    done = command_in_process(args)
    code, out, err = done.returncode, done.stdout, done.stderr
    assert code == 0, err[-3000:]
    for needle in needles:
        assert needle in out, out[:3000]
    assert not list(tmp_path.iterdir())


def test_cfg_of_a_bad_command_is_bad_input(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    done = command_in_process(["--cfg", "job", "model=nonexistent"])
    code, err = done.returncode, done.stderr
    assert code == 2 and "Traceback" not in err and "model" in err, err[-3000:]


@pytest.mark.parametrize("multirun", [False, True], ids=["run", "sweep"])
def test_output_directory_that_cannot_be_created(multirun, monkeypatch, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    args = ["-m", "training.seed=1,2"] if multirun else []
    done = command_in_process([*args, f"{key}={blocker}/out"])
    code, err = done.returncode, done.stderr
    assert code == 2, err[-3000:]
    assert err.startswith(f"error: {key}: '{blocker}/out' cannot be created: '{blocker}' is a file, not a directory")
    assert "Traceback" not in err and blocker.read_text() == "not a directory"


# The packages a run needs and an answer about the config does not (the bulk of a run's start).
RUN_ONLY_PACKAGES = {"torch", "torchtitan", "transformers", "datasets"}


def imported_packages(importtime: str) -> set[str]:
    """The top-level packages a ``python -X importtime`` process imported, from its stderr."""
    return {line.rsplit("|", 1)[1].strip().split(".")[0] for line in importtime.splitlines() if line.startswith("import time:")}


@pytest.mark.slow
@pytest.mark.parametrize(
    "args,status,needle",
    [
        (
            ["training.stpes=1"],
            2,
            "error: training.stpes: Key 'stpes' not in 'TrainingConfig' (command line: training.stpes=1); no such key: did you mean steps",
        ),
        (["model=nonexistent"], 2, "the options of model are"),
        (["training.steps=many"], 2, "training.steps: Value 'many' of type 'str' could not be converted to Integer"),
        (["backend.kernels=nki"], 2, "it belongs to backend=nki_moe"),
        (["--help"], 0, "== Configuration groups =="),
        (["--cfg", "job"], 0, "local_batch_size: 2"),
    ],
    ids=["typo", "unknown-option", "wrong-type", "other-option's-key", "help", "cfg-job"],
)
def test_answers_about_the_config_import_no_torch(args, status, needle, tmp_path):
    answer_without_torch(args, status, [needle], tmp_path)
    assert not list(tmp_path.iterdir()), "an answer about the config writes nothing"


def answer_without_torch(args: list[str], status: int, needles: list[str], cwd) -> str:
    """``python -m qwen3_trn ARGS`` in ``cwd``: its exit status and answer, with neither torch,
    torchtitan, transformers nor datasets imported."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "qwen3_trn", *args],
        cwd=cwd,
        env=cli_env({"PYTHONPATH": str(REPO)}),
        capture_output=True,
        text=True,
        timeout=120,
    )
    answer = done.stdout + "\n".join(line for line in done.stderr.splitlines() if not line.startswith("import time:"))
    assert done.returncode == status, answer[-3000:]
    for needle in needles:
        assert needle in answer and "Traceback" not in answer, answer[-3000:]
    imported = imported_packages(done.stderr)
    assert "hydra" in imported and "qwen3_trn" in imported
    assert imported & RUN_ONLY_PACKAGES == set()
    return answer


@pytest.mark.slow
@pytest.mark.parametrize(
    "args,needles",
    [
        (["training.steps=0"], ["error: training.steps: must be >= 1, got 0; valid: >= 1 (the default is 40)."]),
        (
            ["training.steps=0", "optimizer.lr=-1"],
            ["error: 2 problems with this command:", "training.steps: must be >= 1, got 0", "optimizer.lr: must be >= 0, got -1.0"],
        ),
        (["data=files"], ["error: data.path: has no value; data=files needs data.path=<file | directory | glob>"]),
        (
            ["optimizer.eps=nan", "data=files", "data.path=absent.jsonl", "checkpoint.initial_load_path=weights"],
            [
                "error: 3 problems with this command:",
                "optimizer.eps: must be a finite number",
                "absent.jsonl' does not exist or matches no .jsonl/.json/.parquet/.txt file",
                "weights' does not exist; pass a DCP checkpoint folder",
            ],
        ),
        (
            # a typo stops Hydra's composition; the rest of the command is checked without it
            ["training.stpes=1", "model.n_layerz=2", "optimizer.lr=-1", "data=files", "data.path=absent.jsonl"],
            [
                "error: 4 problems with this command:",
                "training.stpes: Key 'stpes' not in 'TrainingConfig'",
                "model.n_layerz: Key 'n_layerz' not in 'ModelConfig'",
                "optimizer.lr: must be >= 0, got -1.0",
                "absent.jsonl' does not exist",
            ],
        ),
    ],
    ids=["range", "two-ranges", "no-data-path", "range-and-paths", "typos-ranges-and-paths"],
)
def test_values_out_of_range_are_answered_without_torch(args, needles, tmp_path):
    """A value out of range (with every path that does not exist beside it) and a key without a
    value: exit 2 before the run's modules are imported, the run directory Hydra made removed."""
    answer = answer_without_torch([*args, "hydra.run.dir=runs/run"], 2, needles, tmp_path)
    assert answer.count("\n\n  ") == (int(needles[0].split()[1]) if "problems" in needles[0] else 0), answer
    assert not (tmp_path / "runs" / "run").exists()
