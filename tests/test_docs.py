"""Every shell command shown in README.md and docs/*.md runs here, or says why it cannot.

The commands are the lines of the fenced ``bash``/``sh``/``shell`` blocks (``\\``-continued
lines joined, ``# comments`` dropped) and the ``$ `` lines of ``console``/``text``/plain blocks,
whose other lines show the command's output. An HTML comment on the line right before a fence
(invisible on GitHub) says how the block's commands are treated:

- ``<!-- not-run: REASON -->``: not run here (needs a GPU, Trainium, Slurm, the network; a
  benchmark that takes minutes). Still checked without running: a ``python -m qwen3_trn``
  command composes, a ``python -m qwen3_trn.<module>`` module exists, a ``python <script>``
  exists and knows every ``--option`` shown.
- ``<!-- run-by: PATH -->``: every command is a line of PATH, which runs it (CI's ``.ci/run``).
- ``<!-- exit: N -->``: the commands exit with status N (a documented refusal), not 0.
- ``<!-- fill: WHAT -->``: the commands name placeholders that the test fills with what it makes
  first, by running the docs' own commands: ``outputs/runs/<date>/<time>`` (a run with DCP
  checkpoints and a Hugging Face export), ``outputs/sweeps/<date>/<time>`` (a sweep) and
  ``my_corpus/`` (a folder of JSON lines with a ``body`` column).

Every other command runs and must exit 0: ``python -m qwen3_trn ARGS`` through the command's
entry point in this process (``command_in_process``; a run through the session's ``shared_run``,
whose runs tests/test_training.py reads too),
``python -m qwen3_trn.<module> ARGS`` through the module's ``main(ARGS)``, and
``pip install -e SPEC && REST`` as REST, once this checkout is seen to be the installed package.
A command of any other form, or with an unfilled ``<placeholder>``, fails the test: mark it.
Where a block shows output, every output line's text up to its first digit (its label, when it
has one) must start a line of the real output, so the labels, headings and messages cannot
drift while measured numbers may.
"""

from __future__ import annotations

import contextlib
import gzip
import importlib.util
import json
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from qwen3_trn.data.embedded import corpus_path
from tests.commands import command_in_process, entry_point_in_process
from tests.conftest import REPO, SharedRun, compose_config

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "launchers" / "slurm" / "README.md"]
SHELL = {"bash", "sh", "shell"}
MARKERS = {"not-run", "run-by", "exit", "fill"}
RUN_PLACEHOLDER = "outputs/runs/<date>/<time>"
SWEEP_PLACEHOLDER = "outputs/sweeps/<date>/<time>"
CORPUS_PLACEHOLDER = "my_corpus/"
# The docs' own commands that make what the placeholders stand for.
MAKES_RUN = "python -m qwen3_trn checkpoint=hf_export checkpoint.enable=true"
MAKES_SWEEP = "python -m qwen3_trn -m backend=native,nki_moe model=tiny_moe training.steps=10"


@dataclass
class Command:
    doc: Path
    line: int  # 1-based line of the command in its file
    text: str  # as shown, comments dropped, continuations joined
    markers: dict[str, str]
    output: list[str] = field(default_factory=list)  # the lines shown after a `$ ` command

    @property
    def id(self) -> str:
        return f"{self.doc.relative_to(REPO)}:{self.line}"


def _markers(lines: list[str], fence: int) -> dict[str, str]:
    found = {}
    i = fence - 1
    while i >= 0 and (m := re.fullmatch(r"\s*<!--\s*([\w-]+):\s*(.*?)\s*-->\s*", lines[i])):
        found[m.group(1)] = m.group(2)
        i -= 1
    return found


def _shell_commands(body: list[tuple[int, str]]) -> list[tuple[int, str]]:
    commands, pending, start = [], "", 0
    for number, raw in body:
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        start = start if pending else number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        commands.append((start, re.sub(r"\s+#.*", "", pending + line)))  # a comment: `#` after a blank
        pending = ""
    return commands


def extract(doc: Path) -> list[Command]:
    lines = doc.read_text().splitlines()
    commands, i = [], 0
    while i < len(lines):
        fence = re.match(r"\s*```(\S*)", lines[i])
        if not fence:
            i += 1
            continue
        language, start = fence.group(1), i
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip().startswith("```"))
        body = [(j + 1, lines[j]) for j in range(start + 1, end)]
        markers = _markers(lines, start)
        if language in SHELL:
            commands += [Command(doc, n, text, markers) for n, text in _shell_commands(body)]
        elif language in ("console", "text", ""):
            for n, text in body:
                if text.startswith("$ "):
                    commands.append(Command(doc, n, text[2:].strip(), markers))
                elif commands and commands[-1].doc == doc and commands[-1].line > start:
                    commands[-1].output.append(text)
        i = end + 1
    return commands


COMMANDS = [command for doc in DOCS for command in extract(doc)]


def _argv(text: str) -> list[str]:
    return shlex.split(text, comments=True)


# --------------------------------------------------------------------------------------------
# Running a command
# --------------------------------------------------------------------------------------------


@dataclass
class Result:
    code: int
    output: str
    run_dir: Path | None = None


class Runner:
    """Runs each distinct command once (README and docs repeat some), in a directory of its own,
    and makes what the placeholders stand for by running the commands that make it."""

    def __init__(self, root: Path, shared_run: Callable[..., SharedRun]):
        self.root = root
        self.shared_run = shared_run  # the session's runs, shared with other tests
        self.results: dict[str, Result] = {}

    def fill(self, text: str) -> str:
        if RUN_PLACEHOLDER in text:
            text = text.replace(RUN_PLACEHOLDER, str(self.made(MAKES_RUN).run_dir))
        if SWEEP_PLACEHOLDER in text:
            text = text.replace(SWEEP_PLACEHOLDER, str(self.made(MAKES_SWEEP).run_dir))
        if CORPUS_PLACEHOLDER in text:
            text = text.replace(CORPUS_PLACEHOLDER, str(self._corpus()) + "/")
        return text

    def made(self, text: str) -> Result:
        result = self.run(text)
        assert result.code == 0, f"{text} (which makes a placeholder's directory) exited {result.code}:\n{result.output[-3000:]}"
        return result

    def _corpus(self) -> Path:
        folder = self.root / "my_corpus"
        if not folder.is_dir():  # the shipped corpus's first 400 documents, text under "body"
            folder.mkdir()
            with gzip.open(corpus_path(), "rt") as corpus:
                texts = [json.loads(line)["text"] for _, line in zip(range(400), corpus)]
            (folder / "part-0.jsonl").write_text("".join(json.dumps({"id": i, "body": t}) + "\n" for i, t in enumerate(texts)))
        return folder

    def run(self, text: str) -> Result:
        text = " ".join(text.split())
        if text not in self.results:
            self.results[text] = self._run(text)
        return self.results[text]

    def _run(self, text: str) -> Result:
        install = re.fullmatch(r"pip install -e (\S+) && (.*)", text)
        if install:
            assert_installed_from_checkout(install.group(1))
            return self.run(install.group(2))
        argv = _argv(text)
        where = self.root / f"cmd{len(self.results)}"
        if argv[:3] == ["python", "-m", "qwen3_trn"] and "-m" in argv[3:]:
            args = [a for a in argv[3:] if a != "-m"]
            with contextlib.chdir(self.root):
                done = command_in_process(["-m", *args, f"hydra.sweep.dir={where}"])
            return Result(done.returncode, done.stdout + done.stderr, where)
        if argv[:3] == ["python", "-m", "qwen3_trn"]:
            with contextlib.chdir(self.root):  # relative paths in a command resolve here
                run = self.shared_run(argv[3:])
            return Result(run.result.returncode, run.result.stdout + run.result.stderr, run.run_dir)
        if argv[:2] == ["python", "-m"] and argv[2].startswith("qwen3_trn."):
            return _run_module(argv[2], argv[3:], self.root)
        pytest.fail(f"no way to run {text!r} here: mark its block <!-- not-run: REASON --> or make it runnable")


def _run_module(module: str, args: list[str], cwd: Path) -> Result:
    """``python -m MODULE ARGS`` through the module's ``main(argv)`` (a package's in its
    ``__main__``), which keeps its functions picklable for the processes it starts."""
    name = f"{module}.__main__" if importlib.util.find_spec(module).submodule_search_locations else module
    with contextlib.chdir(cwd):
        done = entry_point_in_process(lambda: importlib.import_module(name).main(), [module, *args])
    return Result(done.returncode, done.stdout + done.stderr)


def assert_installed_from_checkout(spec: str) -> None:
    """``pip install -e SPEC`` is the environment these tests run in: this checkout is the
    package imported, and the extras' requirements import."""
    import qwen3_trn

    assert Path(qwen3_trn.__file__).resolve().parent == REPO / "qwen3_trn", f"qwen3_trn is imported from {qwen3_trn.__file__}"
    extras = re.fullmatch(r"'?\.(?:\[(\w+)\])?'?", spec)
    assert extras, f"pip install -e {spec}: not an install of this checkout"
    if extras.group(1) == "test":
        assert importlib.util.find_spec("pytest") is not None


def output_labels(shown: list[str]) -> list[str]:
    """Each shown output line's text before its first digit: labels, headings, messages."""
    labels = []
    for line in shown:
        label = re.split(r"\d", line.strip(), maxsplit=1)[0].rstrip()
        if len(label) >= 4:
            labels.append(label)
    return labels


# --------------------------------------------------------------------------------------------
# Checks of commands that are not run here
# --------------------------------------------------------------------------------------------


def _first_choice(override: str) -> str:
    """A sweep override's first value (``a=1,2`` -> ``a=1``); brackets and quotes kept whole."""
    key, sep, value = override.partition("=")
    depth = 0
    for i, ch in enumerate(value):
        if ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
        elif ch == "," and depth == 0:
            return key + sep + value[:i]
    return override


def check_without_running(text: str) -> None:
    argv = _argv(text)
    if argv[:3] == ["python", "-m", "qwen3_trn"]:
        overrides = [_first_choice(a) for a in argv[3:] if a != "-m" and not a.startswith("hydra")]
        compose_config(overrides)
    elif argv[:2] == ["python", "-m"] and argv[2].startswith("qwen3_trn."):
        assert importlib.util.find_spec(argv[2]) is not None, f"no module {argv[2]}"
    elif argv[:1] == ["python"] and argv[1].endswith(".py"):
        script = REPO / argv[1]
        assert script.is_file(), f"{argv[1]} does not exist"
        source = script.read_text()
        for option in (a.split("=")[0] for a in argv[2:] if a.startswith("--")):
            assert f'"{option}"' in source, f"{argv[1]} has no option {option}"


# --------------------------------------------------------------------------------------------
# The tests
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def runner(tmp_path_factory: pytest.TempPathFactory, shared_run: Callable[..., SharedRun]) -> Runner:
    return Runner(tmp_path_factory.mktemp("docs"), shared_run)


def test_commands_are_found_and_markers_known():
    assert len(COMMANDS) > 30
    for command in COMMANDS:
        unknown = set(command.markers) - MARKERS
        assert not unknown, f"{command.id}: unknown marker(s) {sorted(unknown)}; known: {sorted(MARKERS)}"
        if "not-run" in command.markers:
            assert command.markers["not-run"], f"{command.id}: not-run needs a reason"


@pytest.mark.parametrize("command", COMMANDS, ids=[c.id for c in COMMANDS])
def test_doc_command(command: Command, runner: Runner):
    markers = command.markers
    if "not-run" in markers:
        check_without_running(command.text)
        pytest.skip(f"not run here: {markers['not-run']}")
    if "run-by" in markers:
        runs_it = (REPO / markers["run-by"]).read_text().splitlines()
        assert command.text in [line.strip() for line in runs_it], f"{markers['run-by']} does not run {command.text!r}"
        return
    if "fill" not in markers:
        assert "<" not in command.text, f"{command.id}: {command.text!r} has a placeholder: mark its block fill or not-run"
    text = runner.fill(command.text)
    assert not re.search(r"<[a-z][^>]*>", text), f"{command.id}: {text!r}: a placeholder the test does not fill"
    result = runner.run(text)
    expected = int(markers.get("exit", 0))
    assert result.code == expected, f"{command.id}: {text!r} exited {result.code}, not {expected}:\n{result.output[-3000:]}"
    lines = [line.strip() for line in result.output.splitlines()]
    for label in output_labels(command.output):
        assert any(line.startswith(label) for line in lines), (
            f"{command.id}: no output line starts with {label!r}:\n{result.output[-3000:]}"
        )


def test_readme_summary_table_has_the_rows_the_default_run_prints(runner: Runner):
    """The README's sample summary shows the rows ``python -m qwen3_trn`` prints."""
    printed = runner.made("python -m qwen3_trn").output
    readme = (REPO / "README.md").read_text()
    shown = re.search(r"\n```\n(┌.*?┘)\n```", readme, re.S).group(1)

    def rows(table: str) -> list[str]:
        return [line.split("│")[1].strip() for line in table.splitlines() if line.startswith("│")]

    assert rows(shown) == rows(printed)
