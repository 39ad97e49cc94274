"""``pip install -e .`` on AWS's Trainium stack keeps AWS's torch and torchtitan, and installs
everything the package imports (docs/hardware.md, "On Trainium").

AWS's DLAMI venv holds torch-neuronx's PyTorch 2.14.0 and TorchTitan Neuron, whose
``pip install -e .`` provides ``torchtitan`` as 0.2.2+neuron.1. Neither can be installed here, so
a fresh virtual environment stands in for that venv:

- torch: this environment's torch and every distribution it requires, linked (not copied) into a
  folder the venv reads through a ``.pth`` file, its metadata saying 2.14.0 as Neuron's build
  does. pip never uninstalls a distribution outside its own venv, so the linked files are safe.
- the fork: upstream torchtitan at a9c5edc74 (the last commit of the window the fork is cut from,
  ``shared/torchtitan-window/`` next to the checkout), installed editable under the fork's name
  and version, without dependencies: nothing the project needs comes from it.

The project is then installed for real, as the docs say: a ``--dry-run`` report lists
distributions, not the modules they provide, so only an installed venv shows that each import
the package makes is there. About a minute, most of it pip resolving and unpacking.
"""

from __future__ import annotations

import ast
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from qwen3_trn.results.records import read_metrics
from tests.conftest import REPO

pytestmark = pytest.mark.slow

FORK_ARCHIVE = REPO.parent / "shared" / "torchtitan-window" / "torchtitan-a9c5edc74.tar.gz"
FORK_VERSION = "0.2.2+neuron.1"
NEURON_TORCH_VERSION = "2.14.0"
PACKAGES = ("qwen3_trn", "hydra_plugins")

FORK_PYPROJECT = f"""\
[build-system]
requires = ["setuptools>=64"]
build-backend = "setuptools.build_meta"

[project]
name = "torchtitan"
version = "{FORK_VERSION}"
requires-python = ">=3.10"
# upstream torchtitan's own dependencies at a9c5edc74 (its pyproject.toml): the fork's install
# brings them (AWS's docs: `pip install -r requirements.txt && pip install -e .`)
dependencies = [
    "torchdata>=0.8.0", "datasets>=3.6.0", "tokenizers>=0.15.0", "safetensors", "fsspec", "tyro",
    "tensorboard", "wandb", "einops", "pillow", "spmd_types==0.2.1",
]

[tool.setuptools.packages.find]
include = ["torchtitan*"]
"""


def requirement_closure(name: str) -> list[importlib.metadata.Distribution]:
    """The installed distribution ``name`` and every one it requires here, extras followed."""
    found: dict[str, tuple[importlib.metadata.Distribution, set[str]]] = {}
    todo = [(name, frozenset[str]())]
    while todo:
        wanted, extras = todo.pop()
        dist = importlib.metadata.distribution(wanted)
        dist_extras = found.setdefault(canonicalize_name(dist.metadata["Name"]), (dist, set()))[1]
        asked = {"", *extras}
        if asked <= dist_extras:
            continue
        dist_extras |= asked
        for line in dist.requires or []:
            requirement = Requirement(line)
            if requirement.marker is None or any(requirement.marker.evaluate({"extra": extra}) for extra in asked):
                todo.append((requirement.name, frozenset(requirement.extras)))
    return [dist for dist, _ in found.values()]


def link_neuron_torch(site: Path, venv_site: Path) -> None:
    """This environment's torch, with what it requires, visible to the venv's pip and Python as
    installed, reporting Neuron's version. The venv's own pip and setuptools stay its own."""
    own = {canonicalize_name(path.name.split("-")[0]) for path in venv_site.glob("*.dist-info")}
    site.mkdir()
    for dist in requirement_closure("torch"):
        if canonicalize_name(dist.metadata["Name"]) in own:
            continue
        root = Path(dist.locate_file(""))
        for top in {file.parts[0] for file in dist.files or []}:
            if top not in ("..", "__pycache__") and not top.endswith(".pth") and not (site / top).exists():
                (site / top).symlink_to(root / top)
    linked = next(site.glob("torch-*.dist-info"))
    neuron = site / f"torch-{NEURON_TORCH_VERSION}.dist-info"
    shutil.copytree(linked.resolve(), neuron)
    linked.unlink()
    metadata = neuron / "METADATA"
    metadata.write_text(re.sub(r"(?m)^Version: .*$", f"Version: {NEURON_TORCH_VERSION}", metadata.read_text(), count=1))
    (venv_site / "neuron_torch.pth").write_text(f"{site}\n")


def make_fork(folder: Path) -> Path:
    with tarfile.open(FORK_ARCHIVE) as archive:
        archive.extractall(folder, filter="data")
    (folder / "pyproject.toml").write_text(FORK_PYPROJECT)
    return folder


def optional_distributions(requires_dist: list[str]) -> set[str]:
    """Distributions only an extra of the project asks for, from its installed metadata."""
    requirements = [Requirement(line) for line in requires_dist]
    required = {canonicalize_name(r.name) for r in requirements if r.marker is None or r.marker.evaluate({"extra": ""})}
    return {canonicalize_name(r.name) for r in requirements} - required


def _guards_import_error(node: ast.Try) -> bool:
    names = []
    for handler in node.handlers:
        kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
        names += [kind.id for kind in kinds if isinstance(kind, ast.Name)]
    return bool({"ImportError", "ModuleNotFoundError"} & set(names))


def _imports(node: ast.AST, guarded: bool, found: dict[str, bool]) -> None:
    """Top-level module names ``node`` imports; True where each import of it is tried (a
    ``try`` catching ImportError around it, the package going on without it)."""
    if isinstance(node, ast.Try) and _guards_import_error(node):
        for statement in node.body:
            _imports(statement, True, found)
        for part in (*node.handlers, *node.orelse, *node.finalbody):
            _imports(part, guarded, found)
        return
    modules = []
    if isinstance(node, ast.Import):
        modules = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        modules = [node.module]
    for module in modules:
        top = module.split(".")[0]
        found[top] = found.get(top, True) and guarded
    for child in ast.iter_child_nodes(node):
        _imports(child, guarded, found)


def required_modules(requires_dist: list[str]) -> list[str]:
    """Every third-party module the package imports, except those it tries (the vendor's
    ``torch_neuronx``) and those only an extra provides (``submitit``: launcher=slurm)."""
    found: dict[str, bool] = {}
    for package in PACKAGES:
        for source in sorted((REPO / package).rglob("*.py")):
            _imports(ast.parse(source.read_text()), False, found)
    by_module = importlib.metadata.packages_distributions()
    optional = optional_distributions(requires_dist)
    return sorted(
        module
        for module, tried in found.items()
        if not tried
        and module not in sys.stdlib_module_names
        and module not in PACKAGES
        and not {canonicalize_name(dist) for dist in by_module.get(module, [module])} <= optional
    )


def venv_env() -> dict[str, str]:
    """The user's shell inside the venv: pip's own configuration kept, nothing of this checkout's
    environment on the path."""
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    return {**env, "PYTHONNOUSERSITE": "1"}


def run(command: list[str], cwd: Path | None = None, timeout: float = 420) -> subprocess.CompletedProcess:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=venv_env())
    assert done.returncode == 0, f"{' '.join(command)} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def neuron_venv(tmp_path_factory: pytest.TempPathFactory):
    """(venv python, the fork's folder, pip's report of ``pip install -e <checkout>``)."""
    if not FORK_ARCHIVE.exists():
        pytest.skip(
            f"{FORK_ARCHIVE} is absent: the torchtitan snapshot the Neuron fork stands in for comes from the shared/ folder next to the checkout"
        )
    work = tmp_path_factory.mktemp("neuron_venv")
    venv = work / "venv"
    run([sys.executable, "-m", "venv", str(venv)])
    python = str(venv / "bin" / "python")
    link_neuron_torch(work / "neuron-site", next((venv / "lib").glob("python*/site-packages")))
    fork = make_fork(work / "torchtitan-neuron")
    # --no-compile: pip would byte-compile every module it installs (transformers alone has
    # thousands); what is installed is the same, and the modules the tests import compile as they load.
    run([python, "-m", "pip", "install", "--quiet", "--no-compile", "-e", str(fork)])
    report = work / "report.json"
    run([python, "-m", "pip", "install", "--quiet", "--no-compile", "--report", str(report), "-e", "."], cwd=REPO)  # as the docs say
    yield python, fork, json.loads(report.read_text())
    shutil.rmtree(work, ignore_errors=True)  # about 900 MB of packages


def test_install_keeps_neuron_torch_and_the_fork(neuron_venv):
    python, fork, report = neuron_venv
    installed = {canonicalize_name(item["metadata"]["name"]): item["metadata"]["version"] for item in report["install"]}
    assert "qwen3-trn" in installed
    replaced = {name: installed[name] for name in ("torch", "torchtitan") if name in installed}
    assert not replaced, f"pip install -e . replaced AWS's builds with {replaced}"
    probe = (
        "import importlib.metadata as m, importlib.util as u, json; "
        "print(json.dumps([m.version('torch'), m.version('torchtitan'), u.find_spec('torchtitan').origin]))"
    )
    torch_version, titan_version, titan_origin = json.loads(run([python, "-c", probe]).stdout)
    assert (torch_version, titan_version) == (NEURON_TORCH_VERSION, FORK_VERSION)
    assert Path(titan_origin).is_relative_to(fork)


def test_install_brings_what_the_package_imports(neuron_venv):
    python, _, report = neuron_venv
    project = next(item["metadata"] for item in report["install"] if canonicalize_name(item["metadata"]["name"]) == "qwen3-trn")
    modules = required_modules(project["requires_dist"])
    for expected in ("datasets", "hydra", "matplotlib", "optuna", "rich", "safetensors", "torch", "transformers", "wandb"):
        assert expected in modules, f"{expected}: the package's imports were not all found"
    check = (
        "import importlib, json, sys\n"
        "missing = []\n"
        "for name in sys.argv[1:]:\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except Exception as exc:\n"
        "        missing.append(f'{name}: {type(exc).__name__}: {exc}')\n"
        "print(json.dumps(missing))\n"
    )
    assert json.loads(run([python, "-c", check, *modules]).stdout) == []


def test_the_command_trains_on_the_fork(neuron_venv, tmp_path):
    """The installed command on AWS's stack as the venv stands it in: it reports the fork's
    version, says what is off there, and trains (qwen3_trn.titan adapts to the window)."""
    python, _, _ = neuron_venv
    plan = run([python, "-m", "qwen3_trn", "mode=plan", f"hydra.run.dir={tmp_path / 'plan'}"], cwd=tmp_path)
    assert f"torchtitan: {FORK_VERSION}\n" in plan.stdout
    assert "off here: chunked loss: " in plan.stdout
    run([python, "-m", "qwen3_trn", "debug=smoke", f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path)
    losses = [record["loss"] for record in read_metrics(tmp_path / "run") if "loss" in record]
    assert len(losses) == 3 and losses[-1] < losses[0]
