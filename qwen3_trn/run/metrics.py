"""Per-step metrics file, live progress and the run summary, on top of torchtitan's metrics.

``RunMetricsProcessor`` is torchtitan's ``MetricsProcessor`` with more loggers on the
metrics rank: one JSON line per logged step in ``metrics.jsonl`` (the run's own record,
read by reports), a progress view on the console and, when ``logger.backends`` has wandb, the
project's own wandb run (``qwen3_trn.run.tracking``, in place of torchtitan's env-var-only
``WandBLogger``). Its ``close`` writes ``summary.json``.

Validation (``qwen3_trn.run.validation``) runs right after the training step it follows: its
held-out figures (``val_loss``, ``val_perplexity``) join that step's line in metrics.jsonl and
its wandb row, and get a line of their own in the console progress.

In a trial of a search (``sweep.trial`` set, ``qwen3_trn.sweeps.search``) each validation loss is also
reported to the Optuna trial by the metrics rank, which asks the study's pruner whether to stop;
every rank gets its answer at the same step and, when pruned, raises ``TrialPruned`` (the run's
status ``pruned``) after the metrics rank has noted the step in summary.json.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch.distributed as dist

from qwen3_trn.backends import Backend
from qwen3_trn.common.local_tensors import local_tensor
from qwen3_trn.config.schema import TrialConfig
from qwen3_trn.hf.export import latest_hf_export
from qwen3_trn.results.records import (
    LAUNCH_TIME_ENV,
    METRICS_FILE,
    read_metrics,
    summarize,
    update_summary,
    write_metrics_summary,
    write_text_atomic,
)
from qwen3_trn.run.tracking import start_wandb
from qwen3_trn.run.trials import TrialPruned, TrialReporter
from qwen3_trn.run.validation import VALIDATION_LOSS, is_validation_step, validation_record
from qwen3_trn.titan import BaseLogger, LoggerContainer, MetricsProcessor, _get_metrics_rank

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
    """Appends one JSON line per logged step and keeps what the summary needs.

    At a step that a validation follows (``validates(step)``), the line waits for it and is
    written with the held-out figures merged in; every other line is written at once.
    """

    def __init__(self, path: Path, data_parallel: int, launch_time: float | None, validates=lambda step: False) -> None:
        self.path = path
        self.data_parallel = data_parallel
        self.launch_time = launch_time
        self.validates = validates
        self.records: list[dict[str, Any]] = []
        self._pending: dict[str, Any] | None = None
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("a", buffering=1)

    def log(self, metrics: dict[str, Any], step: int) -> None:
        if VALIDATION_LOSS in metrics:
            record = self._pending if self._pending is not None and self._pending["step"] == step else {"step": step}
            self._pending = None
            record.update(validation_record(metrics))
            self._write(record)
            return
        if "loss_metrics/global_avg_loss" not in metrics:
            return
        self.flush()
        record = _record(metrics, step, self.data_parallel, self.launch_time)
        if self.validates(step):
            self._pending = record
        else:
            self._write(record)

    def _write(self, record: dict[str, Any]) -> None:
        if not self.records:
            self._drop_steps_from(record["step"])
        self.records.append(record)
        self._file.write(json.dumps(record) + "\n")

    def _drop_steps_from(self, step: int) -> None:
        """A resumed run (a requeued Slurm job, a restart in the same run directory) starts
        again after its checkpoint: the lines an earlier start logged from ``step`` on belong to
        training state that the checkpoint did not keep, and are dropped, so that the file has
        each step once and in order."""
        records = read_metrics(self.path.parent)  # a torn last line (a killed start) is skipped
        kept = [record for record in records if record["step"] < step]
        if len(kept) == len(records):
            return
        self._file.close()
        write_text_atomic(self.path, "".join(json.dumps(record) + "\n" for record in kept))
        self._file = self.path.open("a", buffering=1)

    def flush(self) -> None:
        if self._pending is not None:
            self._write(self._pending)
            self._pending = None

    def close(self) -> None:
        self.flush()
        self._file.close()


class ProgressLogger(BaseLogger):
    """Step, loss, tokens/s and ETA: a live bar on a terminal, a plain line otherwise.

    The bar is drawn when a step is logged, at most every ``REDRAW_S`` seconds, and once more
    when training ends, not by rich's refresh thread, which would redraw it ten times a second
    and take the interpreter from the training loop each time."""

    REDRAW_S = 0.5

    def __init__(self, total_steps: int, data_parallel: int) -> None:
        self.total_steps = total_steps
        self.data_parallel = data_parallel
        self.started = time.perf_counter()
        self.first_step: int | None = None
        self._progress = None
        self._drawn = -math.inf
        if sys.stdout.isatty():
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self._progress = Progress(
                TextColumn("[bold]step"),
                MofNCompleteColumn(),
                BarColumn(),
                TextColumn("loss [green]{task.fields[loss]:.4f}"),
                TextColumn("val [magenta]{task.fields[val_loss]:.4f}"),
                TextColumn("[blue]{task.fields[tps]:,.0f} tok/s"),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                transient=False,
                auto_refresh=False,
            )
            self._task = self._progress.add_task("train", total=total_steps, loss=math.nan, val_loss=math.nan, tps=0.0)
            self._progress.start()

    def _redraw(self) -> None:
        now = time.perf_counter()
        if now - self._drawn >= self.REDRAW_S:
            self._progress.refresh()
            self._drawn = now

    def log(self, metrics: dict[str, Any], step: int) -> None:
        if VALIDATION_LOSS in metrics:
            held_out = validation_record(metrics)
            if self._progress is not None:
                self._progress.update(self._task, val_loss=held_out["val_loss"])
                self._redraw()
            else:
                print(
                    f"step {step:>5}/{self.total_steps}  val_loss {held_out['val_loss']:8.4f}  "
                    f"perplexity {held_out['val_perplexity']:10,.2f}",
                    flush=True,
                )
            return
        if "loss_metrics/global_avg_loss" not in metrics:
            return
        loss = float(metrics["loss_metrics/global_avg_loss"])
        tps = float(metrics.get("throughput(tps)", 0.0)) * self.data_parallel
        if self._progress is not None:
            self._progress.update(self._task, completed=step, loss=loss, tps=tps)
            self._redraw()
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
            self._progress.stop()  # draws the last state


class WandbMetricsLogger(BaseLogger):
    """Feeds the project's wandb run the same per-step record as metrics.jsonl."""

    def __init__(self, run, data_parallel: int, launch_time: float | None) -> None:
        self.run = run
        self.data_parallel = data_parallel
        self.launch_time = launch_time

    def log(self, metrics: dict[str, Any], step: int) -> None:
        if "loss_metrics/global_avg_loss" in metrics:
            self.run.log(metrics, step, _record(metrics, step, self.data_parallel, self.launch_time))
        elif VALIDATION_LOSS in metrics:
            self.run.log(metrics, step, validation_record(metrics))
        else:
            self.run.log(metrics, step)

    def close(self) -> None:
        self.run.close()


def _reporter(trial: TrialConfig | None, run_dir: str) -> TrialReporter | None:
    """The reporter of the search trial this run is, or None outside a search."""
    if trial is None or trial.storage is None or trial.study is None:
        return None
    return TrialReporter(trial.storage, trial.study, trial.number, run_dir)


class RunMetricsProcessor(MetricsProcessor):
    @dataclass(kw_only=True, slots=True)
    class Config(MetricsProcessor.Config):
        run_dir: str = ""
        """Run directory: metrics.jsonl and summary.json are written here by the metrics rank."""

        total_steps: int = 0
        console_progress: bool = True

        run_info: dict[str, Any] = field(default_factory=dict)
        """Facts recorded verbatim in summary.json (backend, device, kernel, world size...)."""

        validation_interval: int = 0
        """validation.interval when validation is on (its lines wait for it), else 0."""

        hf_export_dir: str = ""
        """Where the Hugging Face exports go (checkpoint=hf_export); the last one is named in summary.json."""

        backend: Backend | None = None
        """The run's backend, the one object of this process (``convert.to_trainer_config``):
        what the built model ran (``Backend.what_ran``) into summary.json."""

        trial: TrialConfig | None = None
        """``sweep.trial`` of the run: the search trial its validation losses are reported to."""

    def __init__(self, config: Config, **kwargs: Any) -> None:
        self._jsonl: JsonlLogger | None = None
        self._wandb = None
        self._validation_tokens: dict[str, Any] = {}
        self._metrics_rank = 0
        super().__init__(config, **kwargs)
        self._trial = _reporter(config.trial, config.run_dir) if config.run_dir else None

    def record_validation_tokens(self, sha256: str, tokens: int) -> None:
        """Called by ``RunValidator``: which tokens the held-out figures were computed on."""
        self._validation_tokens = {"validation_tokens_sha256": sha256, "validation_tokens": tokens}

    def _validates(self, step: int) -> bool:
        interval = self.config.validation_interval
        return interval > 0 and is_validation_step(step, interval, self.config.total_steps)

    def log_validation(self, loss: float, step: int, extra_metrics: dict[str, Any] | None = None) -> None:
        super().log_validation(loss, step, extra_metrics)
        if self._trial is None:
            return
        rank = dist.get_rank() if dist.is_initialized() else 0
        decision = [self._trial.report(float(loss), step) if rank == self._metrics_rank else False]
        if dist.is_initialized() and dist.get_world_size() > 1:  # every rank stops at the same step
            dist.broadcast_object_list(decision, src=self._metrics_rank)
        if not decision[0]:
            return
        trial = "" if self._trial.number is None else f", trial {self._trial.number}"
        message = f"pruned by the search at step {step} (validation loss {float(loss):.4f}{trial})"
        if rank == self._metrics_rank:
            update_summary(Path(self.config.run_dir), pruned={"step": step, "val_loss": float(loss)})
        raise TrialPruned(message)

    def _build_metric_logger(self, *, config: Config, parallel_dims, **kwargs: Any) -> BaseLogger:
        # enable_wandb selects the project's own wandb run below, not torchtitan's WandBLogger.
        use_wandb = config.enable_wandb
        titan_config = dataclasses.replace(config, enable_wandb=False) if use_wandb else config
        base = super()._build_metric_logger(config=titan_config, parallel_dims=parallel_dims, **kwargs)
        rank = dist.get_rank() if dist.is_initialized() else 0
        self._metrics_rank = _get_metrics_rank(parallel_dims=parallel_dims, pp_schedule=kwargs.get("pp_schedule", "1F1B"))
        if rank != self._metrics_rank:
            return base
        container = base if isinstance(base, LoggerContainer) else LoggerContainer()
        data_parallel = parallel_dims.dp_replicate * parallel_dims.dp_shard
        launch = os.environ.get(LAUNCH_TIME_ENV)
        launch_time = float(launch) if launch else None
        self._jsonl = JsonlLogger(Path(config.run_dir) / METRICS_FILE, data_parallel, launch_time, self._validates)
        container.add_logger(self._jsonl)
        if use_wandb:
            self._wandb = start_wandb(Path(config.run_dir), config.run_info)
            if self._wandb is not None:
                container.add_logger(WandbMetricsLogger(self._wandb, data_parallel, launch_time))
        if config.console_progress:
            container.add_logger(ProgressLogger(config.total_steps, data_parallel))
        return container

    def what_ran(self) -> dict[str, Any]:
        """Facts of this rank's built model, which win over the parent's predictions: the
        device and dtypes of the parameters, FSDP's compute dtype, and what the mode reports
        (the kernel chosen for the local expert shards)."""
        parts = list(getattr(self, "model_parts", None) or [])
        params = [p for part in parts for p in part.parameters()]
        if not params:
            return {}
        first = local_tensor(params[0])
        facts: dict[str, Any] = {"device": first.device.type, "param_dtype": str(first.dtype).removeprefix("torch.")}
        for part in parts:
            for module in part.modules():
                state = getattr(module, "_get_fsdp_state", None)
                policy = getattr(state(), "_mp_policy", None) if callable(state) else None
                if policy is not None:
                    facts["compute_dtype"] = str(policy.param_dtype or first.dtype).removeprefix("torch.")
                    break
            if "compute_dtype" in facts:
                break
        facts.setdefault("compute_dtype", facts["param_dtype"])
        if self.config.backend is not None:
            facts.update(self.config.backend.what_ran(parts, first.device.type))
        return facts

    def close(self) -> None:
        what_ran = self.what_ran()
        run_info = {**self.config.run_info, **what_ran, **self._validation_tokens}
        export = latest_hf_export(self.config.hf_export_dir)
        if export is not None:
            run_info["hf_export"] = str(export)
        if self._jsonl is not None:
            self._jsonl.flush()
        if self._wandb is not None:
            if self._jsonl is not None:
                self._wandb.set_summary({**summarize(self._jsonl.records), **self._validation_tokens})
            self._wandb.record_what_ran(what_ran)
            run_info["wandb_run"] = self._wandb.info()
        super().close()
        if self._jsonl is not None:
            write_metrics_summary(Path(self.config.run_dir), self._jsonl.records, run_info)
