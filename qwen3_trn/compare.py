"""``python -m qwen3_trn.compare [OVERRIDES ...]``: do the training modes compute the same model?

Trains every mode that can build the model from the same initial weights and batches, each a
real ``python -m qwen3_trn`` run (a process forked from a server that imported torch and
torchtitan once for the comparison), and reports per step each mode's loss difference to
``native`` against its tolerance (``MEASURED``). Exit status: 0 every mode agrees, 1 one does
not or its run failed, 2 a bad command. How and why: docs/parity.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import runpy
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from qwen3_trn.common.allocator import exec_with_tcmalloc

# First, before torch loads, as ``python -m qwen3_trn`` does: the modes' runs fork from this
# process's server and keep its host allocator (qwen3_trn.common.allocator).
if __name__ == "__main__":
    exec_with_tcmalloc()

from qwen3_trn.cli.early import CONF_DIR, command_problems  # noqa: E402
from qwen3_trn.cli.exits import imports_of_entry_point  # noqa: E402
from qwen3_trn.common.fork_server import fork_server, start_child  # noqa: E402

# A torchtitan that lacks what the package uses: exit 2 as the command (qwen3_trn.cli.exits).
with imports_of_entry_point(__name__):
    from qwen3_trn.common.errors import ConfigError
    from qwen3_trn.config.overrides import override_key
    from qwen3_trn.kernels.registry import DEVICE_KERNELS
    from qwen3_trn.results.records import LOGS_DIR, read_metrics, read_summary, write_json_atomic, write_text_atomic
    from qwen3_trn.run import worker
    from qwen3_trn.run.tracking import wandb_api_key
    from qwen3_trn.titan import TRANSFORMERS_BACKEND

EXIT_AGREE, EXIT_DIFFER, EXIT_BAD_COMMAND = 0, 1, 2
REFERENCE = "native"
PARITY_JSON, PARITY_MD, INIT_DIR = "parity.json", "parity.md", "init"

# Keys the command sets per mode or for all modes; given by the user they would break the comparison.
OWN_KEYS = {
    "backend": "choose the modes with --modes",
    "hydra.run.dir": "choose the output folder with --out",
    "checkpoint.initial_load_in_hf": "the command sets it for every mode",
}


@dataclass(frozen=True)
class Mode:
    name: str
    overrides: tuple[str, ...]
    # What computes the model (a key of MATH_WHY): tolerance_for says what to expect of it.
    math: str


MATH_WHY = {
    "torchtitan": "torchtitan's Qwen3 modules",
    "transformers": "transformers' Qwen3 modeling: other modules, another reduction order",
    "grouped_mm": "torchtitan's grouped-matmul experts, in fp32 where torchtitan casts them to bf16",
    "padded_bmm": "experts as padded batched matmuls: another reduction order",
    "nki": "the NKI expert kernel",
}
# Math that is native's own in these compute dtypes: grouped_mm is torchtitan's GroupedExperts
# math (kernels/moe.py), and torchtitan runs its experts in bf16 whatever the compute dtype.
NATIVE_MATH_IN = {
    "torchtitan": {"bfloat16": "the same modules", "float32": "the same modules"},
    "grouped_mm": {"bfloat16": "torchtitan's grouped-matmul expert math in bf16, as native runs it"},
}

# The largest |loss difference| to native over 10 steps of model=tiny and model=tiny_moe, keyed
# by (math, compute dtype, model kind, start), from
#   python benchmarks/parity_tolerance.py
# (the larger of two document orders); the tolerance is twice it (docs/parity.md).
MEASURED: dict[tuple[str, str, str, str], float] = {
    ("transformers", "bfloat16", "dense", "init"): 5.0e-03,
    ("transformers", "float32", "dense", "init"): 1.3e-05,
    ("transformers", "bfloat16", "moe", "init"): 1.0e-02,
    ("transformers", "float32", "moe", "init"): 2.9e-03,
    ("grouped_mm", "float32", "moe", "init"): 2.8e-02,
    ("padded_bmm", "bfloat16", "moe", "init"): 1.8e-02,
    ("padded_bmm", "float32", "moe", "init"): 2.8e-02,
    ("transformers", "bfloat16", "dense", "checkpoint"): 2.5e-01,
    ("transformers", "float32", "dense", "checkpoint"): 1.4e-06,
    ("transformers", "bfloat16", "moe", "checkpoint"): 2.2e-01,
    ("transformers", "float32", "moe", "checkpoint"): 1.6e-02,
    ("grouped_mm", "float32", "moe", "checkpoint"): 1.0e-01,
    ("padded_bmm", "bfloat16", "moe", "checkpoint"): 7.1e-02,
    ("padded_bmm", "float32", "moe", "checkpoint"): 1.0e-01,
}
MARGIN = 2.0


def tolerance_for(math_name: str, compute_dtype: str, kind: str, start: str) -> tuple[float, str]:
    """The accepted |loss difference| to native for a mode's math on a dense or moe model, from
    the native init or a given checkpoint, and why."""
    if compute_dtype in NATIVE_MATH_IN.get(math_name, {}):
        return 0.0, f"bitwise: {NATIVE_MATH_IN[math_name][compute_dtype]}"
    why = MATH_WHY.get(math_name, math_name)
    if (math_name, compute_dtype, kind, start) in MEASURED:
        measured = MEASURED[(math_name, compute_dtype, kind, start)]
        return MARGIN * measured, f"within tolerance: {why}; {measured:.1e} measured ({kind}, {compute_dtype}, from {start}) x{MARGIN:g}"
    largest = max(MARGIN * value for (_, dtype, _, _), value in MEASURED.items() if dtype == compute_dtype)
    return largest, f"within tolerance: {why}; not measured, the largest measured in {compute_dtype} x{MARGIN:g}"


NATIVE = Mode(REFERENCE, ("backend=native",), "torchtitan")


def modes_for(moe: bool, device: str) -> list[Mode]:
    """Every mode that builds this model on this device and torchtitan, native first."""
    modes = [NATIVE]
    if TRANSFORMERS_BACKEND.available:  # off on torchtitan main before 0.3 (qwen3_trn.titan)
        modes.append(Mode("hf_v5", ("backend=hf_v5",), "transformers"))
    if moe:
        for kernel in DEVICE_KERNELS.get(device, ()):
            overrides = ("backend=nki_moe", f"backend.kernels={kernel}")
            modes.append(Mode(f"nki_moe/{kernel}", overrides, kernel))
    return modes


@dataclass
class Pair:
    mode: str
    expected: str
    tolerance: float
    largest_diff: float | None = None
    largest_at: int | None = None
    parts_at: int | None = None
    error: str | None = None

    @property
    def agrees(self) -> bool:
        return self.error is None and self.parts_at is None


@dataclass
class Parity:
    out: str
    initial_weights: str
    compute_dtype: str
    modes: list[str]
    losses: dict[str, dict[int, float]]
    run_dirs: dict[str, str]
    pairs: list[Pair] = field(default_factory=list)

    @property
    def agrees(self) -> bool:
        return all(pair.agrees for pair in self.pairs)


def compare_losses(reference: dict[int, float], other: dict[int, float], pair: Pair) -> Pair:
    """Fill ``pair`` from the per-step losses of native and of the mode."""
    if set(other) != set(reference):
        pair.error = pair.error or f"logged steps {sorted(other)}, native logged {sorted(reference)}"
        return pair
    for step in sorted(reference):
        diff = abs(other[step] - reference[step])
        if math.isnan(diff) or diff > pair.tolerance:
            pair.parts_at = pair.parts_at or step
        if pair.largest_diff is None or diff > pair.largest_diff:
            pair.largest_diff, pair.largest_at = diff, step
    return pair


def render(parity: Parity) -> str:
    names = parity.modes
    width = max(len(name) for name in [*names, "vs native", "0.000000"]) + 2
    lines = [
        f"parity of {len(names)} modes from {parity.initial_weights} (compute {parity.compute_dtype})",
        "",
        "step  " + "".join(name.ljust(width) for name in names),
    ]
    steps = sorted(parity.losses.get(REFERENCE, {}))
    for step in steps:
        cells = [f"{parity.losses[name][step]:.6f}" if step in parity.losses.get(name, {}) else "-" for name in names]
        lines.append(f"{step:<6d}" + "".join(cell.ljust(width) for cell in cells))
    lines += ["", "vs native".ljust(width) + "largest diff  at step  tolerance  verdict          expected"]
    for pair in parity.pairs:
        if pair.error:
            verdict = "run failed"
        elif pair.agrees:
            verdict = "agrees"
        else:
            verdict = f"parts at step {pair.parts_at}"
        largest = "-" if pair.largest_diff is None else f"{pair.largest_diff:.2e}"
        at = "-" if pair.largest_at is None else str(pair.largest_at)
        lines.append(f"{pair.mode.ljust(width)}{largest:<14s}{at:<9s}{pair.tolerance:<11.2e}{verdict:<17s}{pair.expected}")
    lines += [f"{pair.mode}: {pair.error}" for pair in parity.pairs if pair.error]
    lines.append("")
    if parity.agrees:
        lines.append(f"parity: every mode agrees with native ({PARITY_JSON} in {parity.out})")
    else:
        parted = [p for p in parity.pairs if not p.agrees]
        first = ", ".join(p.mode + (f" at step {p.parts_at}" if p.parts_at else " (run failed)") for p in parted)
        lines.append(f"parity: modes part from native: {first} ({PARITY_JSON} in {parity.out})")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------
# The command
# ------------------------------------------------------------------------------------------


class RunFailed(Exception):
    def __init__(self, mode: str, status: int, log: Path) -> None:
        self.status = status
        lines = log.read_text(errors="replace").splitlines()
        start = next((i for i, line in enumerate(lines) if line.startswith("error:")), None)
        said = "\n".join(lines[start:])[:2000] + "\n" if start is not None else ""
        super().__init__(f"the {mode} run exited {status}; its output: {log}\n{said}".rstrip())


def run_mode(name: str, overrides: list[str], out: Path) -> Path:
    """One real ``python -m qwen3_trn`` run into ``<out>/<name>``; its output in ``<out>/logs``."""
    run_dir = out / name.replace("/", "-")
    log = out / LOGS_DIR / f"{run_dir.name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    args = [*overrides, f"hydra.run.dir={run_dir}"]
    print(f"parity: {name} ...", flush=True)
    log.write_text(" ".join([sys.executable, "-m", "qwen3_trn", *args]) + "\n")
    process = start_child(_run_command, args, str(log), name=f"parity {name}")
    process.join()
    if process.exitcode != 0:
        raise RunFailed(name, process.exitcode, log)
    return run_dir


def _run_command(args: list[str], log: str) -> None:
    """``python -m qwen3_trn ARGS`` in this child of the comparison's fork server, its output
    appended to ``log``."""
    with open(log, "a") as sink:
        os.dup2(sink.fileno(), sys.stdout.fileno())
        os.dup2(sink.fileno(), sys.stderr.fileno())
    sys.argv = ["qwen3_trn", *args]
    runpy.run_module("qwen3_trn", run_name="__main__", alter_sys=True)


def is_hf_folder(path: Path) -> bool:
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def check_command(overrides: list[str], modes: list[str] | None, extra: list[str]) -> None:
    """ConfigErrors for a bad command, before anything trains."""
    for override in overrides:
        key = override_key(override)
        for own, fix in OWN_KEYS.items():
            if key == own or key.startswith(own + "."):
                raise ConfigError(key, f"the parity command sets it per mode; drop '{override}' ({fix}).")
    known = {REFERENCE, "hf_v5", "nki_moe"}
    for name in modes or []:
        if name.split("/")[0] not in known:
            raise ConfigError("--modes", f"unknown mode '{name}'; choose from native, hf_v5, nki_moe/<kernel>.")
    for item in extra:
        name, _, override = item.partition(":")
        if not override or "=" not in override:
            raise ConfigError("--with", f"'{item}' is not MODE:KEY=VALUE, e.g. --with hf_v5:training.seed=1.")
    load = next((o.split("=", 1)[1] for o in overrides if override_key(o) == "checkpoint.initial_load_path"), None)
    if load is not None and not is_hf_folder(Path(load)):
        raise ConfigError(
            "checkpoint.initial_load_path",
            f"'{load}' is not a Hugging Face model folder (config.json and *.safetensors); "
            "give one (e.g. a run's hf/step-N from checkpoint=hf_export), or leave it out to start from the native init.",
        )
    # what every mode's run would refuse, before the first one trains (a --with override: its mode's run)
    problem = command_problems([*overrides, *NATIVE.overrides], CONF_DIR)
    if problem is not None:
        raise problem


def initial_weights(overrides: list[str], out: Path) -> Path:
    """The given HF checkpoint, else the native init exported by a run of one step at lr 0."""
    load = next((o.split("=", 1)[1] for o in overrides if override_key(o) == "checkpoint.initial_load_path"), None)
    if load is not None:
        return Path(load).resolve()
    init = [
        *overrides,
        "backend=native",
        "training.steps=1",
        "optimizer.lr=0",
        "optimizer.warmup_steps=0",
        "validation=off",
        "checkpoint=hf_export",
        "logger=none",
    ]
    return Path(read_summary(run_mode(INIT_DIR, init, out))["hf_export"])


def default_out() -> Path:
    return Path("outputs/parity") / time.strftime("%Y-%m-%d") / time.strftime("%H-%M-%S")


def log_to_wandb(parity: Parity, reference_dir: Path, group: str) -> None:
    """The parity table as a wandb run of the modes' group, where the runs log to wandb."""
    planned = read_summary(reference_dir).get("wandb")  # the reference run's wandb settings, when it logged
    if not planned:
        return
    import wandb

    columns = ["step", *parity.modes]
    rows = [[step, *(parity.losses.get(name, {}).get(step) for name in parity.modes)] for step in sorted(parity.losses[REFERENCE])]
    run = wandb.init(
        project=planned["project"],
        entity=planned["entity"],
        mode="offline" if planned["mode"] == "online" and not wandb_api_key() else planned["mode"],
        dir=parity.out,
        group=group,
        job_type="parity",
        name=group,
        config={"initial_weights": parity.initial_weights, "compute_dtype": parity.compute_dtype, "modes": parity.modes},
        settings=wandb.Settings(console="off", quiet=True),
    )
    run.log({"parity/losses": wandb.Table(columns=columns, data=rows)})
    run.summary.update(
        {"agrees": parity.agrees, **{f"largest_diff/{p.mode}": p.largest_diff for p in parity.pairs if p.largest_diff is not None}}
    )
    run.finish()


def compare(
    overrides: list[str], out: Path, modes: list[str] | None = None, extra: list[str] = (), tolerance: float | None = None
) -> Parity:
    """Train the modes and compare them; raises ConfigError for a bad command."""
    check_command(overrides, modes, list(extra))
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    group = f"parity-{out.parent.name}-{out.name}"
    weights = initial_weights(overrides, out)
    start = "init" if weights.is_relative_to(out) else "checkpoint"
    common = [o for o in overrides if override_key(o) != "checkpoint.initial_load_path"]
    common += [f"checkpoint.initial_load_path={weights}", "checkpoint.initial_load_in_hf=true", f"logger.wandb.group={group}"]
    per_mode: dict[str, list[str]] = {}
    for item in extra:
        name, _, override = item.partition(":")
        per_mode.setdefault(name, []).append(override)

    hf_config = json.loads((weights / "config.json").read_text())
    moe = bool(hf_config.get("num_experts") or hf_config.get("num_local_experts"))
    reference_dir = run_mode(REFERENCE, [*common, *NATIVE.overrides, *per_mode.get(REFERENCE, [])], out)
    summary = read_summary(reference_dir)
    chosen = [
        m
        for m in modes_for(moe, summary.get("device", "cpu"))
        if m.name != REFERENCE and (not modes or m.name in modes or m.name.split("/")[0] in modes)
    ]
    unmatched = [name for name in modes or [] if not any(name in (m.name, m.name.split("/")[0]) for m in chosen)]
    if unmatched:
        available = ", ".join(m.name for m in modes_for(moe, summary.get("device", "cpu")))
        off = "" if TRANSFORMERS_BACKEND.available else f" ({TRANSFORMERS_BACKEND.describe()})"
        raise ConfigError("--modes", f"{', '.join(unmatched)} cannot build this model here; choose from {available}{off}.")
    if not chosen:
        off = "" if TRANSFORMERS_BACKEND.available else f": {TRANSFORMERS_BACKEND.describe()}"
        raise ConfigError("--modes", f"no mode besides native builds this model here, so there is nothing to compare{off}")
    compute_dtype = str(summary.get("compute_dtype", "float32"))
    losses = {REFERENCE: {int(r["step"]): float(r["loss"]) for r in read_metrics(reference_dir) if "loss" in r}}
    run_dirs = {REFERENCE: str(reference_dir)}
    parity = Parity(str(out), str(weights), compute_dtype, [REFERENCE, *(m.name for m in chosen)], losses, run_dirs)
    for mode in chosen:
        limit, why = tolerance_for(mode.math, compute_dtype, "moe" if moe else "dense", start)
        pair = Pair(mode.name, why, limit if tolerance is None else tolerance)
        try:
            run_dir = run_mode(mode.name, [*common, *mode.overrides, *per_mode.get(mode.name, [])], out)
        except RunFailed as exc:
            if exc.status == EXIT_BAD_COMMAND:
                raise ConfigError(f"--modes {mode.name}", f"{exc}; drop the mode or fix the overrides it refuses.") from exc
            pair.error = str(exc)
            parity.pairs.append(pair)
            continue
        run_dirs[mode.name] = str(run_dir)
        losses[mode.name] = {int(r["step"]): float(r["loss"]) for r in read_metrics(run_dir) if "loss" in r}
        parity.pairs.append(compare_losses(losses[REFERENCE], losses[mode.name], pair))

    text = render(parity)
    record = {**asdict(parity), "agrees": parity.agrees, "overrides": overrides, "group": group}
    write_json_atomic(out / PARITY_JSON, record)
    write_text_atomic(out / PARITY_MD, f"# Mode parity\n\n```text\n{text}```\n")
    log_to_wandb(parity, reference_dir, group)
    print(text, end="", flush=True)
    return parity


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m qwen3_trn.compare", description=__doc__.splitlines()[0])
    parser.add_argument("overrides", nargs="*", help="overrides for every mode's run, as for python -m qwen3_trn")
    parser.add_argument("--modes", default=None, help="modes besides native, comma-separated (default: every mode that builds the model)")
    parser.add_argument(
        "--tolerance", type=float, default=None, help="accepted |loss difference| to native for every mode (default: measured)"
    )
    parser.add_argument("--with", dest="extra", action="append", default=[], metavar="MODE:KEY=VALUE", help="an override for one mode only")
    parser.add_argument("--out", type=Path, default=None, help="the output folder (default: outputs/parity/<date>/<time>)")
    args = parser.parse_intermixed_args(argv)  # overrides before and after the options
    modes = [m.strip() for m in args.modes.split(",") if m.strip()] if args.modes else None
    try:
        with fork_server([worker.__name__]):  # started by the first run
            parity = compare(args.overrides, args.out or default_out(), modes, args.extra, args.tolerance)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        sys.exit(EXIT_BAD_COMMAND)
    except RunFailed as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        sys.exit(EXIT_BAD_COMMAND if exc.status == EXIT_BAD_COMMAND else EXIT_DIFFER)
    sys.exit(EXIT_AGREE if parity.agrees else EXIT_DIFFER)


if __name__ == "__main__":
    main()
