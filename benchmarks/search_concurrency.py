"""What running trials at once saves a search: ``hparams_search=tiny_lr`` (``model=tiny``) one
trial at a time and with ``hydra.sweeper.n_concurrent=N``, alternating in one session.

    python benchmarks/search_concurrency.py [--pairs 3] [--trials 8] [--concurrent 2] [key=value ...]

Prints, per setting, the exact command, the median wall time of the whole search, its trials'
outcomes and how many ran at once at most (from the study's own times, as search.html draws
them), then the wall-time ratio. ``--concurrent 1`` runs the same search in both arms (the key
is passed only when N > 1): a check of the script, and of the noise between identical arms.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import optuna

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from qwen3_trn.report.search import most_at_once, trial_spans  # noqa: E402

STUDY = "tiny_lr"


def command(trials: int, concurrent: int, overrides: list[str]) -> list[str]:
    key = [f"hydra.sweeper.n_concurrent={concurrent}"] if concurrent > 1 else []
    return [
        sys.executable,
        "-m",
        "qwen3_trn",
        f"hparams_search={STUDY}",
        "model=tiny",
        f"hydra.sweeper.n_trials={trials}",
        *key,
        *overrides,
    ]


def run(cmd: list[str], sweep_dir: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    started = time.perf_counter()
    done = subprocess.run([*cmd, f"hydra.sweep.dir={sweep_dir}"], check=False, cwd=REPO, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - started
    if done.returncode:
        sys.exit(f"failed: {shlex.join(cmd)}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{sweep_dir / 'optuna.db'}")
    states = Counter(t.state.name.lower() for t in study.trials)
    return {"wall_s": wall, "states": states, "at_once": most_at_once(trial_spans(study))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--concurrent", type=int, default=2, help="hydra.sweeper.n_concurrent of the second arm")
    parser.add_argument("overrides", nargs="*", default=[])
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    settings = {
        "sequential": command(args.trials, 1, args.overrides),
        f"{args.concurrent} at once": command(args.trials, args.concurrent, args.overrides),
    }
    results: dict[str, list[dict]] = {name: [] for name in settings}
    with tempfile.TemporaryDirectory() as tmp:
        for pair in range(args.pairs):
            order = list(settings) if pair % 2 == 0 else list(reversed(settings))
            for name in order:
                results[name].append(run(settings[name], Path(tmp) / f"{pair}-{name.replace(' ', '-')}"))
    print(f"{args.pairs} runs each, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end")
    print("| setting | command | wall s (median) | trials (last run) | most at once (max) |")
    print("|---|---|---|---|---|")
    medians = {}
    for name, runs in results.items():
        medians[name] = statistics.median(r["wall_s"] for r in runs)
        shown = shlex.join(["python", *settings[name][1:], "hydra.sweep.dir=<fresh dir>"])
        states = ", ".join(f"{n} {state}" for state, n in sorted(runs[-1]["states"].items()))
        print(f"| {name} | `{shown}` | {medians[name]:.1f} | {states} | {max(r['at_once'] for r in runs)} |")
    sequential, concurrent = medians.values()
    print(f"wall-time ratio, sequential / {args.concurrent} at once: {sequential / concurrent:.2f}")


if __name__ == "__main__":
    main()
