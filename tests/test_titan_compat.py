"""The torchtitan compatibility check (``qwen3_trn.titan``): every torchtitan name the package uses
is imported in that one module, and a torchtitan without some of them (the torchtitan-neuron
fork of an older snapshot, say) is one clear error at start, exit 2, naming every missing name
and the version found."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from qwen3_trn import titan
from qwen3_trn.config.typed import to_run_config
from qwen3_trn.run.convert import compile_warning
from tests.commands import cli_env, command_in_process
from tests.conftest import REPO, compose_config

PACKAGE = REPO / "qwen3_trn"


def torchtitan_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "torchtitan":
            found.append(node.module)
        elif isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if alias.name.split(".")[0] == "torchtitan"]
    return found


def test_only_the_compat_module_imports_torchtitan():
    importers = {
        str(path.relative_to(REPO)): modules
        for path in PACKAGE.rglob("*.py")
        if "conf" not in path.relative_to(PACKAGE).parts and path.name != "titan.py" and (modules := torchtitan_imports(path))
    }
    assert importers == {}
    assert titan.missing_names() == []


# The child removes names from torchtitan's modules after importing them (so torchtitan's own
# modules are whole), then runs each entry point as ``python -m ENTRY`` does, one after another
# (each imports qwen3_trn.titan afresh: a failed import leaves no module behind), and prints
# each one's exit status and stderr.
CHILD = """
import contextlib, importlib, io, json, runpy, sys
for module in {modules!r}:
    importlib.import_module(module)
for module, name in {removed!r}:
    delattr(sys.modules[module], name)
results = {{}}
for entry, args in {commands!r}:
    sys.argv, stderr, status = [entry, *args], io.StringIO(), 0
    with contextlib.redirect_stderr(stderr):
        try:
            runpy.run_module(entry, run_name="__main__", alter_sys=True)
        except SystemExit as exc:
            status = exc.code
    results[entry] = [status, stderr.getvalue()]
print(json.dumps(results))
"""
REMOVED = [("torchtitan.components.validate", "Validator"), ("torchtitan.models.qwen3", "model_registry")]


def run_without_names(commands: list[tuple[str, list[str]]]) -> dict[str, subprocess.CompletedProcess]:
    """``python -m ENTRY ARGS`` of each command on a torchtitan that lacks ``REMOVED``, in one
    process: each entry's exit status and stderr."""
    modules = sorted({module for module, _ in titan.imported_names(Path(titan.__file__).read_text())})
    code = CHILD.format(modules=modules, removed=REMOVED, commands=commands)
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env=cli_env({"QWEN3_TRN_HOST_ALLOCATOR": "system"}),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.splitlines()[-1])
    return {entry: subprocess.CompletedProcess(entry, status, "", stderr) for entry, (status, stderr) in results.items()}


def assert_one_error_naming_the_missing_names(done: subprocess.CompletedProcess) -> None:
    assert done.returncode == 2, done.stderr[-3000:]
    error = done.stderr.strip()
    assert "Traceback" not in error
    assert error.startswith("error: torchtitan: the installed torchtitan 0.3.0 lacks ")
    assert "lacks torchtitan.components.validate.Validator, torchtitan.models.qwen3.model_registry, which this project uses" in error
    assert "torchtitan-neuron" in error


# A single run and a sweep: qwen3_trn.titan is first imported after composing (by Hydra's
# callbacks, or the sweeper's setup), and its error is bad input wherever that is.
@pytest.mark.slow
@pytest.mark.parametrize("multirun", [False, True], ids=["run", "sweep"])
def test_missing_torchtitan_names_are_one_error_before_anything_starts(multirun, tmp_path):
    args = ["mode=plan", f"output_dir={tmp_path / 'run'}", f"hydra.run.dir={tmp_path / 'run'}"]
    if multirun:
        args = ["-m", "mode=plan", "training.seed=1,2", f"hydra.sweep.dir={tmp_path / 'run'}"]
    assert_one_error_naming_the_missing_names(run_without_names([("qwen3_trn", args)])["qwen3_trn"])
    assert not (tmp_path / "run").exists()


# Every other ``python -m qwen3_trn.<tool>`` that imports torchtitan (qwen3_trn.report does not).
TOOLS = ["qwen3_trn.status", "qwen3_trn.verify", "qwen3_trn.rank", "qwen3_trn.sweeps", "qwen3_trn.compare"]


@pytest.fixture(scope="module")
def tools_without_names(tmp_path_factory: pytest.TempPathFactory) -> dict[str, subprocess.CompletedProcess]:
    folder = tmp_path_factory.mktemp("tools")
    return run_without_names([(entry, [str(folder)]) for entry in TOOLS])


@pytest.mark.slow
@pytest.mark.parametrize("entry", TOOLS)
def test_every_entry_point_names_the_missing_names_with_exit_2(entry, tools_without_names):
    assert_one_error_naming_the_missing_names(tools_without_names[entry])


def test_a_missing_module_or_name_is_named():
    source = "try:\n    from torchtitan.no_such_module import Thing\n    from torchtitan.trainer import Trainer, NoSuchName\nexcept ImportError:\n    pass\n"
    assert titan.missing_names(source) == ["torchtitan.no_such_module.Thing", "torchtitan.trainer.NoSuchName"]


def test_a_feature_this_torchtitan_lacks_is_off_with_its_reason():
    feature = titan._feature(
        "a later feature",
        "2026-09-01",
        "the run does without it",
        ("torchtitan.trainer", "Trainer"),
        ("torchtitan.trainer", "NoSuchName"),
        ("torchtitan.no_such_module", "Thing"),
        key="training.something",
    )
    assert not feature.available
    assert feature["Trainer"] is titan.Trainer
    assert feature.describe() == (
        "a later feature: this torchtitan lacks torchtitan.trainer.NoSuchName, torchtitan.no_such_module.Thing "
        "(upstream added it 2026-09-01); the run does without it."
    )
    # the project's modules subclass a missing class; building one is the feature's refusal
    stand_in = feature["NoSuchName"]
    subclass = type("Sub", (stand_in,), {})
    with pytest.raises(titan.ConfigError) as refused:
        subclass()
    assert refused.value.key == "training.something"
    assert str(refused.value).startswith("training.something: a later feature cannot run on torchtitan 0.3.0: it lacks ")


def test_torchtitan_0_3_has_every_feature():
    assert titan.features_off() == []
    assert titan.EXPERT_MATH == "forward"
    assert titan.torchtitan_version() == "0.3.0"


def test_a_compile_component_torchtitan_ignores_is_one_warning_line(run_dir):
    done = command_in_process(["mode=plan", "compile=inductor", "compile.components=[model,loss,grad_clip]"], run_dir)
    assert done.returncode == 0, done.stderr[-3000:]
    warnings = [line for line in done.stderr.splitlines() if "warning: compile.components" in line]
    assert warnings == [
        "qwen3_trn: warning: compile.components: grad_clip will not be compiled: torchtitan 0.3.0 compiles only model and loss "
        "and ignores the rest, so it runs eagerly; drop grad_clip from compile.components to silence this."
    ]


@pytest.mark.parametrize(
    "overrides",
    [["compile=inductor"], ["compile=off", "compile.components=[model,loss,grad_clip]"]],
    ids=["compiled-components-only", "compile-off"],
)
def test_no_warning_when_every_component_is_compiled_or_nothing_is(overrides, tmp_path):
    assert compile_warning(to_run_config(compose_config(overrides, tmp_path / "run"))) is None


def test_torchtitan_neurons_fork_compiles_grad_clip(tmp_path, monkeypatch):
    (tmp_path / "torchtitan_neuron").mkdir()
    (tmp_path / "torchtitan_neuron" / "__init__.py").write_text("")
    cfg = to_run_config(compose_config(["compile=inductor", "compile.components=[model,loss,grad_clip]"], tmp_path / "run"))
    assert compile_warning(cfg) is not None
    monkeypatch.syspath_prepend(str(tmp_path))
    assert titan.compiled_components() == ("model", "loss", "grad_clip") and compile_warning(cfg) is None


def test_a_dependency_torchtitan_lacks_is_named_not_every_name():
    with pytest.raises(titan.ConfigError) as info:
        titan.check_torchtitan(cause=ModuleNotFoundError("No module named 'torchdata'", name="torchdata"))
    assert not isinstance(info.value, titan.TorchtitanMismatch)
    assert str(info.value).startswith(
        "torchtitan: torchtitan 0.3.0 does not import: it needs the module 'torchdata', which is not installed."
    )
