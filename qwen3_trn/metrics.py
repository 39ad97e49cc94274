"""Per-step metrics file, live progress and the run summary, on top of torchtitan's metrics.

``RunMetricsProcessor`` is torchtitan's ``MetricsProcessor`` with two more loggers on the
metrics rank: one JSON line per logged step in ``metrics.jsonl`` (the run's own record,
read by reports) and a progress view on the console. Its ``close`` writes ``summary.json``.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchtitan.components.metrics import BaseLogger, LoggerContainer, MetricsProcessor

# torchtitan metric name -> name in metrics.jsonl
_RENAMES = {
    "loss_metrics/global_avg_loss": "loss",
    "loss_metrics/global_max_loss": "max_loss",
    "grad_norm": "grad_norm",
    "throughput(tps)": "tokens_per_s_per_rank",
    "tflops": "tflops_per_rank",
    "mfu(%)": "mfu_pct",
    "memory/max_reserved(GiB)": "memory_peak_gib",
    "memory/max_active(GiB)": "memory_active_gib",
    "time_metrics/end_to_end(s)": "step_time_s",
    "time_metrics/data_loading(%)": "data_loading_pct",
    "n_tokens_seen": "tokens_seen",
}


def _record(metrics: dict[str, Any], step: int, data_parallel: int, launch_time: float | None) -> dict[str, Any]:
    record: dict[str, Any] = {"step": step}
    for source, target in _RENAMES.items():
        if source in metrics:
            record[target] = float(metrics[source])
    for key, value in metrics.items():
        if key.startswith("lr"):
            record[key.replace("/", "_")] = float(value)
    if "tokens_per_s_per_rank" in record:
        record["tokens_per_s"] = record["tokens_per_s_per_rank"] * data_parallel
    now = time.time()
    record["time"] = now
    if launch_time is not None:
        record["seconds_since_launch"] = now - launch_time
    return record


class JsonlLogger(BaseLogger):
    """Appends one JSON line per logged step and keeps what the summary needs."""

    def __init__(self, path: Path, data_parallel: int, launch_time: float | None) -> None:
        self.path = path
        self.data_parallel = data_parallel
        self.launch_time = launch_time
        self.records: list[dict[str, Any]] = []
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("a", buffering=1)

    def log(self, metrics: dict[str, Any], step: int) -> None:
        if "loss_metrics/global_avg_loss" not in metrics:
            return
        record = _record(metrics, step, self.data_parallel, self.launch_time)
        self.records.append(record)
        self._file.write(json.dumps(record) + "\n")

    def close(self) -> None:
        self._file.close()


class ProgressLogger(BaseLogger):
    """Step, loss, tokens/s and ETA: a live bar on a terminal, a plain line otherwise."""

    def __init__(self, total_steps: int, data_parallel: int) -> None:
        self.total_steps = total_steps
        self.data_parallel = data_parallel
        self.started = time.perf_counter()
        self.first_step: int | None = None
        self._progress = None
        if sys.stdout.isatty():
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self._progress = Progress(
                TextColumn("[bold]step"),
                MofNCompleteColumn(),
                BarColumn(),
                TextColumn("loss [green]{task.fields[loss]:.4f}"),
                TextColumn("[blue]{task.fields[tps]:,.0f} tok/s"),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                transient=False,
            )
            self._task = self._progress.add_task("train", total=total_steps, loss=math.nan, tps=0.0)
            self._progress.start()

    def log(self, metrics: dict[str, Any], step: int) -> None:
        if "loss_metrics/global_avg_loss" not in metrics:
            return
        loss = float(metrics["loss_metrics/global_avg_loss"])
        tps = float(metrics.get("throughput(tps)", 0.0)) * self.data_parallel
        if self._progress is not None:
            self._progress.update(self._task, completed=step, loss=loss, tps=tps)
            return
        if self.first_step is None:
            self.first_step, self.started = step, time.perf_counter()
            eta = "?"
        else:
            per_step = (time.perf_counter() - self.started) / max(step - self.first_step, 1)
            eta = f"{per_step * (self.total_steps - step):.0f}s"
        print(f"step {step:>5}/{self.total_steps}  loss {loss:8.4f}  {tps:10,.0f} tok/s  ETA {eta}", flush=True)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """First/last loss, steady-state throughput (step 1 excluded: it includes warm-up) and peaks."""
    if not records:
        return {"steps_logged": 0}
    steady = [r for r in records[1:] if "tokens_per_s" in r] or records
    mean = lambda key: sum(r.get(key, 0.0) for r in steady) / len(steady)  # noqa: E731
    summary = {
        "steps_logged": len(records),
        "first_step": records[0]["step"],
        "last_step": records[-1]["step"],
        "first_loss": records[0].get("loss"),
        "last_loss": records[-1].get("loss"),
        "min_loss": min(r.get("loss", math.inf) for r in records),
        "tokens_per_s": mean("tokens_per_s"),
        "tokens_per_s_per_rank": mean("tokens_per_s_per_rank"),
        "peak_memory_gib": max(r.get("memory_peak_gib", 0.0) for r in records),
    }
    if all("mfu_pct" in r for r in steady):
        summary["mfu_pct"] = mean("mfu_pct")
    if "seconds_since_launch" in records[0]:
        summary["seconds_to_first_step"] = records[0]["seconds_since_launch"]
    return summary


class RunMetricsProcessor(MetricsProcessor):
    @dataclass(kw_only=True, slots=True)
    class Config(MetricsProcessor.Config):
        run_dir: str = ""
        """Run directory: metrics.jsonl and summary.json are written here by the metrics rank."""

        total_steps: int = 0
        console_progress: bool = True

        run_info: dict[str, Any] = field(default_factory=dict)
        """Facts recorded verbatim in summary.json (backend, device, kernel, world size...)."""

    def __init__(self, config: Config, **kwargs: Any) -> None:
        self._jsonl: JsonlLogger | None = None
        super().__init__(config, **kwargs)

    def _build_metric_logger(self, *, config: Config, parallel_dims, **kwargs: Any) -> BaseLogger:
        import torch.distributed as dist
        from torchtitan.components.metrics import _get_metrics_rank

        base = super()._build_metric_logger(config=config, parallel_dims=parallel_dims, **kwargs)
        rank = dist.get_rank() if dist.is_initialized() else 0
        if rank != _get_metrics_rank(parallel_dims=parallel_dims, pp_schedule=kwargs.get("pp_schedule", "1F1B")):
            return base
        container = base if isinstance(base, LoggerContainer) else LoggerContainer()
        data_parallel = parallel_dims.dp_replicate * parallel_dims.dp_shard
        launch = os.environ.get("QWEN3_TRN_LAUNCH_TIME")
        self._jsonl = JsonlLogger(Path(config.run_dir) / "metrics.jsonl", data_parallel, float(launch) if launch else None)
        container.add_logger(self._jsonl)
        if config.console_progress:
            container.add_logger(ProgressLogger(config.total_steps, data_parallel))
        return container

    def close(self) -> None:
        super().close()
        if self._jsonl is not None:
            write_summary(Path(self.config.run_dir), self._jsonl.records, self.config.run_info)


def write_summary(run_dir: Path, records: list[dict[str, Any]], run_info: dict[str, Any], status: str | None = None) -> dict:
    path = run_dir / "summary.json"
    previous = json.loads(path.read_text()) if path.exists() else {}
    summary = {**previous, **run_info, **summarize(records), "metrics_file": str(run_dir / "metrics.jsonl")}
    if status is not None:
        summary["status"] = status
    path.write_text(json.dumps(summary, indent=2) + "\n")
    return summary
