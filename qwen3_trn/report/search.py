"""The report of a hyperparameter search (docs/sweeps.md): ``search.html``, ``search.md`` and
``best.yaml`` in the sweep directory, from the Optuna study and its trials' run directories.
In the inline SVG each loss line has the id ``search-loss-trial-<n>`` (``-pruned`` added for a
pruned trial) and each wall-time bar ``search-timeline-trial-<n>-<state>``.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

import optuna
import yaml
from optuna.trial import TrialState

from qwen3_trn.report.figures import _pyplot, _svg
from qwen3_trn.results.quantities import QUANTITIES
from qwen3_trn.results.records import CONFIG_FILE, read_metrics, write_text_atomic
from qwen3_trn.run.trials import WALL_TIME_ATTRS

BEST_FILE = "best.yaml"
SEARCH_HTML = "search.html"
SEARCH_MD = "search.md"
FIGURE_ID = "search-loss"
TIMELINE_ID = "search-timeline"
MIN_TRIALS_FOR_IMPORTANCES = 10
# How the value of a trial (its final validation loss) is written.
VALUE = QUANTITIES["val_loss"]
# How a trial's start and end (seconds since the search's first trial started) are written.
SECONDS = QUANTITIES["wall_time_s"]
# A trial's state (its bar in the timeline, its row in the table of trials) and its colour.
STATE_COLORS = {"complete": "#4c72b0", "pruned": "#a60", "failed": "#b00", "running": "#888"}
STATES = {TrialState.COMPLETE: "complete", TrialState.PRUNED: "pruned", TrialState.FAIL: "failed", TrialState.RUNNING: "running"}


def _trial_state(trial: optuna.trial.FrozenTrial) -> str:
    if trial.state == TrialState.FAIL and trial.user_attrs.get("invalid"):
        return "failed (invalid, not started)"
    return trial.state.name.lower()


def best_trial(study: optuna.Study) -> optuna.trial.FrozenTrial | None:
    try:
        return study.best_trial
    except ValueError:  # no completed trial
        return None


def importances(study: optuna.Study) -> tuple[dict[str, float], str]:
    """Optuna's parameter importances and what they rest on, or why they are withheld."""
    complete = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))]
    if len(complete) < MIN_TRIALS_FOR_IMPORTANCES:
        return {}, (
            f"Parameter importances are withheld until {MIN_TRIALS_FOR_IMPORTANCES} trials have completed "
            f"(this search has {len(complete)}): from fewer they mostly reflect which values the sampler happened to try."
        )
    try:
        weights = dict(optuna.importance.get_param_importances(study))
    except (ValueError, RuntimeError) as exc:
        return {}, f"Optuna computed no parameter importances: {exc}"
    return weights, f"From {len(complete)} completed trials (Optuna's fANOVA evaluator; the importances sum to 1)."


def param_text(value: Any) -> str:
    """A sampled value to a few significant digits (``0.01568``); others as they are."""
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _relative(run_dir: str, sweep_dir: Path) -> str:
    try:
        return str(Path(run_dir).relative_to(sweep_dir))
    except ValueError:
        return run_dir


@dataclass(frozen=True)
class TrialSpan:
    """A trial's time in the search: seconds since the search's first trial started."""

    number: int
    state: str  # a key of STATE_COLORS
    start: float
    end: float  # a running trial: now
    pruned_step: int | None = None


def _wall_time(trial: optuna.trial.FrozenTrial, now: datetime) -> tuple[datetime, datetime]:
    """When the trial's job ran (its user attributes), else when the search asked and told it."""
    started, ended = (trial.user_attrs.get(key) for key in WALL_TIME_ATTRS)
    start = datetime.fromtimestamp(started) if started is not None else trial.datetime_start
    end = datetime.fromtimestamp(ended) if ended is not None else (trial.datetime_complete or now)
    return start, max(start, end)


def trial_spans(study: optuna.Study, now: datetime | None = None) -> list[TrialSpan]:
    """The trials that started (an invalid one never did), over wall time."""
    now = now or datetime.now()
    started = [
        t
        for t in study.get_trials(deepcopy=False)
        if t.datetime_start is not None and t.state in STATES and not t.user_attrs.get("invalid")
    ]
    if not started:
        return []
    times = {t.number: _wall_time(t, now) for t in started}
    origin = min(start for start, _ in times.values())
    spans = []
    for trial in started:
        pruned = trial.state == TrialState.PRUNED and trial.intermediate_values
        start, end = times[trial.number]
        spans.append(
            TrialSpan(
                trial.number,
                STATES[trial.state],
                (start - origin).total_seconds(),
                (end - origin).total_seconds(),
                max(trial.intermediate_values) if pruned else None,
            )
        )
    return spans


def most_at_once(spans: list[TrialSpan]) -> int:
    """The most trials in flight at one moment (one ending as the next starts: one at a time)."""
    events = sorted([(s.start, 1) for s in spans] + [(s.end, -1) for s in spans])  # at a tie, ends first
    most = running = 0
    for _, change in events:
        running += change
        most = max(most, running)
    return most


def plot_timeline(study: optuna.Study, spans: list[TrialSpan]) -> str | None:
    """One bar per trial over wall time (inline SVG), or None when no trial started."""
    if not spans:
        return None
    from matplotlib.patches import Patch

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.3 * len(spans)))
    for span in spans:
        color = STATE_COLORS[span.state]
        (bar,) = ax.barh(
            span.number, span.end - span.start, left=span.start, height=0.6, color=color, hatch="//" if span.state == "running" else None
        )
        bar.set_gid(f"{TIMELINE_ID}-trial-{span.number}-{span.state}")
        if span.pruned_step is not None:
            ax.plot([span.end], [span.number], marker="x", markersize=9, color="black", linestyle="none")
            ax.annotate(f"step {span.pruned_step}", (span.end, span.number), xytext=(6, -3), textcoords="offset points", fontsize=7)
    present = [state for state in STATE_COLORS if any(s.state == state for s in spans)]
    ax.legend(
        handles=[Patch(color=STATE_COLORS[state], label=state) for state in present], fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1)
    )
    ax.set_yticks([s.number for s in spans], [f"trial {s.number}" for s in spans], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(f"wall time since the first trial started ({SECONDS.unit})")
    ax.grid(axis="x", alpha=0.3)
    ax.set_title(f"study {study.study_name}: trials over wall time (at most {most_at_once(spans)} at once; x: pruned at that step)")
    return _svg(fig, TIMELINE_ID)


def plot_trials(study: optuna.Study, run_dirs: dict[int, Path]) -> str | None:
    """Validation loss over steps per trial (inline SVG), or None when no trial validated."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    best = best_trial(study)
    drawn = 0
    for trial in study.get_trials(deepcopy=False):
        run_dir = run_dirs.get(trial.number)
        points = [(r["step"], r["val_loss"]) for r in read_metrics(run_dir) if "val_loss" in r] if run_dir else []
        if not points:
            continue
        steps, losses = zip(*points)
        pruned = trial.state == TrialState.PRUNED
        is_best = best is not None and trial.number == best.number
        label = f"trial {trial.number}" + (" (pruned)" if pruned else " (best)" if is_best else "")
        (line,) = ax.plot(
            steps, losses, linestyle="--" if pruned else "-", linewidth=2.5 if is_best else 1.2, marker="o", markersize=3, label=label
        )
        line.set_gid(f"{FIGURE_ID}-trial-{trial.number}" + ("-pruned" if pruned else ""))
        if pruned:
            ax.plot([steps[-1]], [losses[-1]], marker="x", markersize=10, color=line.get_color(), linestyle="none")
        drawn += 1
    if not drawn:
        plt.close(fig)
        return None
    ax.set_xlabel("step")
    ax.set_ylabel("validation loss")
    ax.set_title(f"study {study.study_name}: validation loss per trial (dashed, x: pruned)")
    ax.legend(fontsize=7, ncol=2)
    return _svg(fig, FIGURE_ID)


def write_best(
    study: optuna.Study, sweep_dir: Path, jobs: dict[int, dict[str, Any]], command_of: Callable[[list[str]], str]
) -> dict[str, Any] | None:
    """``best.yaml``: the best trial's value, parameters, overrides, run directory, a command
    that runs its config alone, and its composed config."""
    best = best_trial(study)
    if best is None:
        return None
    job = jobs.get(best.number, {})
    overrides = [o for o in job.get("overrides", []) if not o.startswith("sweep.trial.")]
    record: dict[str, Any] = {
        "study": study.study_name,
        "direction": study.direction.name.lower(),
        "trial": best.number,
        "value": best.value,
        "params": dict(best.params),
        "overrides": overrides,
        "run_dir": job.get("run_dir"),
        "command": command_of(overrides),
    }
    config_file = Path(job["run_dir"]) / CONFIG_FILE if job.get("run_dir") else None
    if config_file is not None and config_file.is_file():
        record["config"] = yaml.safe_load(config_file.read_text())
    write_text_atomic(sweep_dir / BEST_FILE, yaml.safe_dump(record, sort_keys=False))
    return record


def _rows(study: optuna.Study, jobs: dict[int, dict[str, Any]], sweep_dir: Path, spans: list[TrialSpan]) -> list[list[str]]:
    keys = sorted({k for t in study.trials for k in t.params})
    times = {s.number: s for s in spans}
    rows = [["trial", "state", "value", f"start ({SECONDS.unit})", f"end ({SECONDS.unit})", *keys, "run dir"]]
    for trial in study.trials:
        value = VALUE.format(trial.value)
        if trial.state == TrialState.PRUNED and trial.intermediate_values:
            step = max(trial.intermediate_values)
            value = f"{VALUE.format(trial.intermediate_values[step])} at step {step}"
        span = times.get(trial.number)
        start, end = (SECONDS.format(span.start), "" if span.state == "running" else SECONDS.format(span.end)) if span else ("", "")
        params = [param_text(trial.params.get(k, "")) for k in keys]
        run_dir = _relative(str(jobs.get(trial.number, {}).get("run_dir", "")), sweep_dir)
        rows.append([str(trial.number), _trial_state(trial), value, start, end, *params, run_dir])
    return rows


def write_search_report(
    study: optuna.Study, sweep_dir: Path, jobs: dict[int, dict[str, Any]], command_of: Callable[[list[str]], str]
) -> dict[str, Any]:
    """search.html, search.md and best.yaml in the sweep directory; what was written.
    ``command_of``: the command that runs a trial's overrides alone."""
    run_dirs = {num: Path(job["run_dir"]) for num, job in jobs.items() if job.get("run_dir")}
    best = write_best(study, sweep_dir, jobs, command_of)
    weights, basis = importances(study)
    figure = plot_trials(study, run_dirs)
    spans = trial_spans(study)
    timeline = plot_timeline(study, spans)
    at_once = (
        f"{len(spans)} trials over {SECONDS.with_unit(max(s.end for s in spans))} of wall time, at most {most_at_once(spans)} at once."
        if spans
        else "No trial has started yet."
    )
    rows = _rows(study, jobs, sweep_dir, spans)
    storage_hint = f"optuna-dashboard sqlite:///{sweep_dir / 'optuna.db'}"

    md = [f"# Search {study.study_name}", "", f"Sweep directory: `{sweep_dir}`", ""]
    if best:
        md += [
            f"Best: trial {best['trial']}, {best['direction']} value {VALUE.format(best['value'])}",
            "",
            "```",
            *best["overrides"],
            "```",
            "",
        ]
    else:
        md += ["No trial has completed yet.", ""]
    md += [f"{at_once} Start and end: seconds since the first trial started.", ""]
    md += ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
    md += ["| " + " | ".join(r) + " |" for r in rows[1:]]
    md += ["", "## Parameter importances", ""]
    md += [basis, "", *(f"- `{k}`: {v:.2f}" for k, v in weights.items())]
    md += ["", f"Open the study in optuna-dashboard: `{storage_hint}`", ""]
    write_text_atomic(sweep_dir / SEARCH_MD, "\n".join(md))

    def table(data: list[list[str]]) -> str:
        head = "".join(f"<th>{html.escape(c)}</th>" for c in data[0])
        body = "".join(
            f'<tr id="trial-{html.escape(r[0])}" class="{html.escape(r[1].split()[0])}">'
            + "".join(f"<td>{html.escape(c)}</td>" for c in r)
            + "</tr>"
            for r in data[1:]
        )
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"

    best_html = (
        f'<section id="best"><h2>Best trial: {best["trial"]} (value {VALUE.format(best["value"])})</h2>'
        f"<pre>{html.escape(chr(10).join(best['overrides']))}</pre>"
        f"<p>Its config: <code>{html.escape(str(sweep_dir / BEST_FILE))}</code>; run it alone: <code>{html.escape(best['command'])}</code></p></section>"
        if best
        else '<section id="best"><h2>No trial has completed yet</h2></section>'
    )
    importance_html = f"<p>{html.escape(basis)}</p>" + (
        "<ul>" + "".join(f"<li><code>{html.escape(k)}</code>: {v:.2f}</li>" for k, v in weights.items()) + "</ul>" if weights else ""
    )
    state_css = "".join(f"tr.{state}{{color:{color}}}" for state, color in STATE_COLORS.items() if state != "complete")
    page = (
        f"<!doctype html><html><head><meta charset='utf-8'><title>Search {html.escape(study.study_name)}</title>"
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 6px}"
        f"{state_css}</style></head><body>"
        f"<h1>Search {html.escape(study.study_name)}</h1><p>Sweep directory: <code>{html.escape(str(sweep_dir))}</code></p>"
        f"{best_html}<h2>Validation loss per trial</h2>{figure or '<p>No trial has validated yet.</p>'}"
        f"<h2 id='timeline'>Trials over wall time</h2><p>{html.escape(at_once)}</p>{timeline or ''}"
        f"<h2>Trials</h2>{table(rows)}<h2 id='importances'>Parameter importances</h2>{importance_html}"
        f"<p>Open the study in optuna-dashboard: <code>{html.escape(storage_hint)}</code></p></body></html>"
    )
    write_text_atomic(sweep_dir / SEARCH_HTML, page)
    return {"html": str(sweep_dir / SEARCH_HTML), "markdown": str(sweep_dir / SEARCH_MD), "best": best, "importances": weights}


__all__ = [
    "BEST_FILE",
    "SEARCH_HTML",
    "SEARCH_MD",
    "TrialSpan",
    "best_trial",
    "importances",
    "most_at_once",
    "trial_spans",
    "write_best",
    "write_search_report",
]
