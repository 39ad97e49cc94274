"""Bad input, generated from the schema and its ranges, plus the user's files: each case ends
with exit status 2 before any worker starts, no traceback, the key or file named, and no run
directory written.

The cases run through the command's entry point in this process (``command_in_process``);
``tests/test_errors.py`` runs one as a real ``python -m qwen3_trn`` process to prove the exit
status end to end.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import typing
from enum import Enum
from pathlib import Path

import pytest

from qwen3_trn.common.redact import looks_secret
from qwen3_trn.config.keys import facts, schema_fields
from qwen3_trn.config.ranges import Range, all_ranges
from qwen3_trn.config.schema import RunConfig, option_groups
from qwen3_trn.data.embedded import tokenizer_dir
from tests.commands import command_in_process

# Keys set by the command itself, not by users.
NOT_USER_KEYS = {"output_dir"}
# Values an option needs from the user (``???`` in its schema), so that a case fails on its own key.
OPTION_NEEDS = {
    "data=files": ["data.path=qwen3_trn/data/assets/corpus.jsonl.gz"],
    "data=hub": ["data.path=roneneldan/TinyStories"],
}


def _base(hint):
    """``int`` of ``Optional[int]``."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if typing.get_origin(hint) is typing.Union and len(args) == 1 else hint


def schema_leaves():
    """(dotted key, type, the overrides that select its option) of every user key of the schema."""

    def walk(cls, prefix, select):
        for f in dataclasses.fields(cls):
            hint = _base(typing.get_type_hints(cls)[f.name])
            key = f"{prefix}{f.name}"
            if dataclasses.is_dataclass(hint):
                yield from walk(hint, f"{key}.", select)
            elif key not in NOT_USER_KEYS:
                yield key, hint, select

    for f in dataclasses.fields(RunConfig):
        hint = typing.get_type_hints(RunConfig)[f.name]
        if f.name in option_groups():
            seen = set()
            for option, cls in option_groups()[f.name].registered().items():
                chosen = f"{f.name}={option}"
                for key, leaf_hint, select in walk(cls, f"{f.name}.", [chosen, *OPTION_NEEDS.get(chosen, [])]):
                    if key not in seen:
                        seen.add(key)
                        yield key, leaf_hint, select
        elif dataclasses.is_dataclass(hint):
            yield from walk(hint, f"{f.name}.", [])
        elif f.name not in NOT_USER_KEYS:
            yield f.name, _base(hint), []


def wrong_type(hint) -> str | None:
    origin = typing.get_origin(hint)
    if origin is list:
        return "5"
    if origin is dict:
        return "5"
    if isinstance(hint, type) and issubclass(hint, Enum):
        return "[1]"
    return {int: "abc", float: "abc", bool: "maybe", str: "{a: 1}"}.get(hint)


def out_of_range(rule: Range, steps: int = 40) -> list:
    values = []
    for name, bound in rule.bounds():
        limit = steps if bound == "training.steps" else bound
        candidate = {"ge": limit - 1, "gt": limit, "le": limit + 1 if isinstance(limit, int) else limit + 0.5, "lt": limit}[name]
        while candidate in rule.allow:
            candidate -= 1
        values.append(candidate)
    return values + list(rule.exclude)


# Numbers that parse but are no value for any key: refused for every numeric key (float keys as
# not finite, int keys as not integers).
SPECIAL_NUMBERS = ("inf", "nan")


def _select(key: str) -> list[str]:
    return next((select for leaf, _, select in schema_leaves() if leaf == key), [])


def generated_cases():
    for key, hint, select in schema_leaves():
        value = wrong_type(hint)
        if value is not None:
            yield pytest.param([*select, f"{key}={value}"], key, id=f"type-{key}")
        choice = typing.get_args(hint)[0] if typing.get_origin(hint) is list else hint
        if isinstance(choice, type) and issubclass(choice, Enum):
            bogus = "[bogus]" if typing.get_origin(hint) is list else "bogus"
            yield pytest.param([*select, f"{key}={bogus}"], key, id=f"option-{key}")
        if hint in (int, float):
            for special in SPECIAL_NUMBERS:
                yield pytest.param([*select, f"{key}={special}"], key, id=f"special-{key}={special}")
    for key, rule in all_ranges().items():
        for value in out_of_range(rule):
            yield pytest.param([*_select(key), f"{key}={value}"], key, id=f"range-{key}={value}")


GENERATED = list(generated_cases())


def assert_refused(done: subprocess.CompletedProcess, named: str, run_dir: Path) -> None:
    code, stderr = done.returncode, done.stderr
    assert code == 2, f"exit {code}\n{stderr[-3000:]}"
    assert "Traceback" not in stderr, stderr[-3000:]
    assert named in stderr, stderr[-3000:]
    assert stderr.startswith("error: ") and stderr.count("\nerror: ") == 0, stderr
    assert not run_dir.exists(), "nothing may be written (no worker started) before the input is valid"


def test_the_suite_covers_the_schema():
    assert len(GENERATED) >= 80, len(GENERATED)
    kinds = {p.id.split("-", 1)[0] for p in GENERATED}
    assert kinds == {"type", "option", "range", "special"}
    # every numeric key of the schema has a declared range
    numeric = {key for key, hint, _ in schema_leaves() if hint in (int, float)}
    unranged = numeric - set(all_ranges())
    assert not unranged, f"numeric keys without a range (its key(..., ge=...) in the schema): {sorted(unranged)}"
    # every key that names a file or directory says what it names (a path the run reads is
    # checked before it starts: qwen3_trn.config.paths)
    named_like_paths = {
        key for key, hint, _ in schema_leaves() if hint is str and key.rsplit(".", 1)[-1].endswith(("path", "dir", "_from", "_model"))
    }
    assert named_like_paths >= {
        "data.path",
        "data.val_path",
        "model.hf_assets_path",
        "checkpoint.resume_from",
        "checkpoint.initial_load_path",
    }
    kinds = {key: facts(field).path for key, field in schema_fields(RunConfig)}
    assert not [key for key in named_like_paths if kinds[key] is None], kinds
    # no key of the schema would itself be redacted as a secret
    assert not [key for key, _, _ in schema_leaves() if looks_secret(key.rsplit(".", 1)[-1])]


@pytest.mark.parametrize("overrides,key", GENERATED)
def test_generated_bad_value(overrides, key, tmp_path):
    run_dir = tmp_path / "run"
    done = command_in_process(overrides, run_dir)
    assert_refused(done, key, run_dir)


# --------------------------------------------------------------------------------------------
# The user's files


def _write(path: Path, content: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)
    return path


BINARY = bytes(range(256)) * 16

CONFIG_DIR_CASES = {
    # file under --config-dir, its content, the override that picks it, what the error names
    "malformed-yaml": (
        "optimizer/mine.yaml",
        "lr: [1,\n  2\n",
        "optimizer=mine",
        ["optimizer/mine.yaml, line 3, column 1", "malformed YAML"],
    ),
    "unknown-key": (
        "optimizer/mine.yaml",
        "lr: 0.01\nlrr: 1\n",
        "optimizer=mine",
        ["optimizer.lrr", "optimizer/mine.yaml, line 2, column 1", "did you mean lr"],
    ),
    "wrong-type": (
        "training/mine.yaml",
        "steps: lots\n",
        "training=mine",
        ["training.steps", "training/mine.yaml, line 1, column 1", "give a whole number"],
    ),
    "unknown-option": (
        "model/mine.yaml",
        "flavor: debugmodel\nattention: fastest\n",
        "model=mine",
        ["model.attention", "model/mine.yaml", "use one of auto, sdpa"],
    ),
    "experiment-nested-key": (
        "experiment/mine.yaml",
        "# @package _global_\ntraining:\n  stepz: 3\n",
        "experiment=mine",
        ["training.stepz", "experiment/mine.yaml, line 3, column 3"],
    ),
    "out-of-range": ("optimizer/mine.yaml", "lr: -0.5\n", "optimizer=mine", ["optimizer.lr", "must be >= 0"]),
    # Hydra reads the packaged conf/ first: a file of the same name would be silently unused.
    "shadows-packaged-option": (
        "model/tiny.yaml",
        "n_layers: 1\n",
        "model=tiny",
        ["--config-dir", "model/tiny.yaml has the name of the packaged conf/model/tiny.yaml", "pick it with model=<that name>"],
    ),
    "shadows-primary-config": (
        "config.yaml",
        "training:\n  steps: [1, 2\n",
        "training.steps=3",
        ["--config-dir", "config.yaml has the name of the packaged conf/config.yaml", "--config-name"],
    ),
}


@pytest.mark.parametrize("case", list(CONFIG_DIR_CASES), ids=list(CONFIG_DIR_CASES))
def test_config_dir_file(case, tmp_path):
    name, content, choose, named = CONFIG_DIR_CASES[case]
    config_dir = tmp_path / "conf"
    _write(config_dir / name, content)
    done = command_in_process([choose], tmp_path / "run", config_dir=config_dir)
    for needle in named:
        assert_refused(done, needle, tmp_path / "run")


def _jsonl(rows) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


DATA_CASES = {
    # file name, content, extra overrides, what the error names
    "missing-path": (None, None, [], ["data.path", "does not exist"]),
    "empty": ("empty.jsonl", "", [], ["data.path", "is empty"]),
    "binary-jsonl": ("blob.jsonl", BINARY, [], ["data.path", "blob.jsonl is not text", "not UTF-8"]),
    "binary-txt": ("blob.txt", BINARY, [], ["data.path", "blob.txt is not text"]),
    "gzip-not-gzip": ("blob.jsonl.gz", BINARY, [], ["data.path", "blob.jsonl.gz"]),
    "broken-json-line": (
        "broken.jsonl",
        '{"text": "a"}\n{"text": \n',
        [],
        ["data.path", "broken.jsonl, line 2, column 10", "not valid JSON"],
    ),
    "json-array-broken": ("broken.json", '[{"text": "a"}, {"text" "b"}]', [], ["data.path", "broken.json, line 1, column 25"]),
    "not-parquet": ("blob.parquet", BINARY, [], ["data.path", "parquet", "blob.parquet"]),
    "unreadable-format": ("table.csv", "text\nhello\n", [], ["data.path", "table.csv' is not a format data=files reads"]),
    "missing-text-column": (
        "body.jsonl",
        _jsonl([{"body": "a", "id": 1}] * 3),
        [],
        ["data.text_column", "'text' is not a column", "body, id"],
    ),
    "wrong-text-column": (
        "body.jsonl",
        _jsonl([{"body": "a"}] * 3),
        ["data.text_column=content"],
        ["data.text_column", "'content' is not a column"],
    ),
    "non-text-column": ("nums.jsonl", _jsonl([{"text": 5}] * 3), [], ["data.text_column", "holds int values"]),
    "no-path-given": ("", None, [], ["data.path", "needs data.path"]),
}


@pytest.mark.parametrize("case", list(DATA_CASES), ids=list(DATA_CASES))
def test_data_file(case, tmp_path):
    name, content, extra, named = DATA_CASES[case]
    path = _write(tmp_path / "data" / name, content) if name else tmp_path / "data" / "absent.jsonl"
    given = [] if name == "" else [f"data.path={path}"]
    done = command_in_process(["data=files", *given, *extra], tmp_path / "run")
    for needle in named:
        assert_refused(done, needle, tmp_path / "run")


def _assets(tmp_path: Path, **files: str | bytes) -> Path:
    """A copy of the shipped tokenizer directory with some files replaced."""
    target = tmp_path / "assets"
    target.mkdir()
    for source in tokenizer_dir().iterdir():
        (target / source.name).write_bytes(source.read_bytes())
    for name, content in files.items():
        _write(target / name.replace("__", "."), content)
    return target


TOKENIZER_CASES = {
    "tokenizer-json-malformed": (
        {"tokenizer__json": '{"model": {"vocab": {"a": 1,}}}'},
        [],
        ["model.hf_assets_path", "tokenizer.json, line 1, column 29"],
    ),
    "tokenizer-json-binary": ({"tokenizer__json": BINARY}, [], ["model.hf_assets_path", "tokenizer.json is not text"]),
    "tokenizer-json-not-a-tokenizer": (
        {"tokenizer__json": '{"model": 5}'},
        [],
        ["model.hf_assets_path", "torchtitan cannot load the tokenizer"],
    ),
    "tokenizer-config-malformed": ({"tokenizer_config__json": "{'bos_token': 1}"}, [], ["tokenizer_config.json, line 1, column 2"]),
    "config-json-disagrees": ({"config__json": json.dumps({"vocab_size": 100})}, [], ["config.json says vocab_size 100"]),
    "vocab-larger-than-model": ({}, ["model.vocab_size=100"], ["model.vocab_size", "has 2048 tokens"]),
}


@pytest.mark.parametrize("case", list(TOKENIZER_CASES), ids=list(TOKENIZER_CASES))
def test_tokenizer_file(case, tmp_path):
    files, extra, named = TOKENIZER_CASES[case]
    assets = _assets(tmp_path, **files)
    done = command_in_process([f"model.hf_assets_path={assets}", *extra], tmp_path / "run")
    for needle in named:
        assert_refused(done, needle, tmp_path / "run")


def test_tokenizer_directory_missing(tmp_path):
    done = command_in_process([f"model.hf_assets_path={tmp_path / 'nothing'}"], tmp_path / "run")
    assert_refused(done, "model.hf_assets_path", tmp_path / "run")


def test_hf_model_config_json_malformed(tmp_path):
    model = _write(tmp_path / "hf" / "config.json", '{"architectures": ["Qwen3ForCausalLM"],\n "vocab_size": }').parent
    done = command_in_process(["backend=hf_v5", f"model.hf_model={model}"], tmp_path / "run")
    assert_refused(done, "config.json, line 2, column 16", tmp_path / "run")


def test_run_directory_that_cannot_be_created(tmp_path):
    blocker = _write(tmp_path / "a-file", "not a directory")
    done = command_in_process([], blocker / "run")
    assert_refused(done, "hydra.run.dir", blocker / "run")
    assert f"'{blocker}' is a file, not a directory" in done.stderr
    assert blocker.read_text() == "not a directory"


def test_warm_up_longer_than_the_run_is_refused_when_given(tmp_path):
    done = command_in_process(["training.steps=3", "optimizer.warmup_steps=4"], tmp_path / "run")
    assert_refused(done, "optimizer.warmup_steps: must be <= training.steps (3), got 4", tmp_path / "run")


# Two or more problems in one command: every one is reported, one paragraph each (key, what is
# wrong, the fix), and nothing starts.
ALL_AT_ONCE_CASES = {
    "two-ranges": (["optimizer.lr=-1", "training.local_batch_size=0"], ["optimizer.lr", "training.local_batch_size"]),
    "range-finite-and-data": (
        ["optimizer.eps=nan", "model.n_layers=0", "data=files", "data.path=/nonexistent/corpus.jsonl"],
        ["optimizer.eps: must be a finite number", "model.n_layers: must be >= 1", "data.path: '/nonexistent/corpus.jsonl' does not exist"],
    ),
    "data-resume-model-and-ranks": (
        [
            "data=files",
            "data.path=/nonexistent/corpus.jsonl",
            "checkpoint.resume_from=/nonexistent/run",
            "model.top_k=2",
            "launcher.nproc_per_node=64",
        ],
        ["data.path", "checkpoint.resume_from", "model.top_k", "launcher.nproc_per_node"],
    ),
    "layout-and-tokenizer": (
        ["training.global_batch_size=3", "model.vocab_size=100"],
        ["training.global_batch_size: 3 is not a multiple", "model.vocab_size"],
    ),
    "paths-the-run-reads": (
        [
            "data=files",
            "data.path=qwen3_trn/data/assets/corpus.jsonl.gz",
            "data.val_path=/nonexistent/val.jsonl",
            "checkpoint.initial_load_path=/nonexistent/weights",
            "model.hf_assets_path=/nonexistent/tokenizer",
        ],
        [
            "data.val_path: '/nonexistent/val.jsonl' does not exist",
            "checkpoint.initial_load_path: '/nonexistent/weights' does not exist",
            "model.hf_assets_path: '/nonexistent/tokenizer' does not exist",
        ],
    ),
    "data-and-batch": (
        ["data=files", "data.path=/nonexistent/corpus.jsonl", "training.global_batch_size=3"],
        ["data.path", "training.global_batch_size: 3 is not a multiple"],
    ),
}


@pytest.mark.parametrize("case", list(ALL_AT_ONCE_CASES), ids=list(ALL_AT_ONCE_CASES))
def test_every_problem_of_a_command_at_once(case, tmp_path):
    args, named = ALL_AT_ONCE_CASES[case]
    done = command_in_process(args, tmp_path / "run")
    for needle in named:
        assert_refused(done, needle, tmp_path / "run")
    assert f"error: {len(named)} problems with this command:" in done.stderr
    paragraphs = [p for p in done.stderr.split("\n\n")[1:] if p.strip() and not p.startswith("(set")]
    assert len(paragraphs) == len(named), done.stderr


def test_resume_from_without_a_complete_checkpoint(tmp_path):
    old = tmp_path / "old"
    (old / "checkpoint" / "step-4").mkdir(parents=True)
    (old / "checkpoint" / "step-4" / "__0_0.distcp").write_bytes(b"partial")
    done = command_in_process([f"checkpoint.resume_from={old}"], tmp_path / "run")
    assert_refused(done, "step-4 has no .metadata", tmp_path / "run")
    done = command_in_process([f"checkpoint.resume_from={old / 'checkpoint' / 'step-4'}"], tmp_path / "run")
    assert_refused(done, "is incomplete", tmp_path / "run")
    (tmp_path / "empty").mkdir()
    done = command_in_process([f"checkpoint.resume_from={tmp_path / 'empty'}"], tmp_path / "run")
    assert_refused(done, "holds no step-N checkpoint", tmp_path / "run")
    done = command_in_process([f"checkpoint.resume_from={tmp_path / 'never'}"], tmp_path / "run")
    assert_refused(done, f"checkpoint.resume_from: '{tmp_path / 'never'}' does not exist; pass a run directory", tmp_path / "run")


def test_relative_paths_resolve_against_the_working_directory(tmp_path, monkeypatch):
    """A relative path names a file under the directory the command ran in (the error shows
    the absolute path it looked at)."""
    monkeypatch.chdir(tmp_path)
    _write(tmp_path / "corpus" / "body.jsonl", _jsonl([{"body": "x"}] * 2))
    done = command_in_process(["data=files", "data.path=corpus/body.jsonl"], tmp_path / "run")
    assert_refused(done, f"{tmp_path}/corpus/body.jsonl", tmp_path / "run")
    done = command_in_process(["checkpoint.resume_from=runs/old"], tmp_path / "run")
    assert_refused(done, f"{tmp_path}/runs/old", tmp_path / "run")


COMPOSITION_CASES = {
    "unknown-group-option": (["model=nonexistent"], ["error: model: ", "the options of model are", "tiny_moe"]),
    "unknown-key": (["model.n_layerz=2"], ["model.n_layerz", "did you mean n_layers"]),
    "unknown-key-added": (["+training.foo=1"], ["training.foo"]),
    "key-of-another-option": (["launcher.partition=cpu"], ["launcher.partition", "belongs to launcher=slurm"]),
    "ambiguous-list": (["training.steps=1,2"], ["training.steps", "to sweep over it add -m"]),
    "unparsable-override": (["training.steps=["], ["training.steps", "cannot parse the override"]),
    "env-var-unset": (["run_name=${oc.env:QWEN3_TRN_TEST_UNSET_VARIABLE}"], ["run_name", "QWEN3_TRN_TEST_UNSET_VARIABLE"]),
}


@pytest.mark.parametrize("case", list(COMPOSITION_CASES), ids=list(COMPOSITION_CASES))
def test_composition_error(case, tmp_path):
    args, named = COMPOSITION_CASES[case]
    done = command_in_process(args, tmp_path / "run")
    for needle in named:
        assert_refused(done, needle, tmp_path / "run")


def test_composition_errors_keep_the_library_message_without_reading_it():
    """The key, the place and the fix come from the exceptions' types and attributes: a library
    that words its messages differently changes only the message quoted in the paragraph."""
    from hydra.errors import MissingConfigException
    from omegaconf.errors import ConfigKeyError, ValidationError

    from qwen3_trn.config.composition import composition_error
    from qwen3_trn.config.schema import ModelConfig, TrainingConfig

    def raised(exc, full_key, key, object_type):
        exc.full_key, exc.key, exc.object_type, exc.ref_type = full_key, key, object_type, object_type
        return exc

    wrong_type = composition_error(raised(ValidationError("reworded: steps wants a number"), "training.steps", "steps", TrainingConfig))
    assert wrong_type.key == "training.steps"
    assert str(wrong_type).startswith("training.steps: reworded: steps wants a number; give a whole number (the default is ")
    unknown = composition_error(raised(ConfigKeyError("reworded"), "model.n_layerz", "n_layerz", ModelConfig))
    assert unknown.key == "model.n_layerz" and "reworded; no such key: did you mean n_layers?" in str(unknown)
    missing = composition_error(MissingConfigException("reworded", missing_cfg_file="model/mine", options=["tiny", "tiny_moe"]))
    assert str(missing) == "model: reworded; the options of model are tiny, tiny_moe: pick one, or add a model/mine.yaml with --config-dir."
