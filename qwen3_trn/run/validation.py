"""Held-out loss through torchtitan's own ``Validator``, its evaluation loop unchanged
(docs/validation.md). ``RunValidator`` adds a validation at the run's last step, its own row
length and batch size (so jobs of a sweep over the training shape evaluate the same tokens), and a
SHA-256 of the token ids evaluated for ``summary.json``. The digest covers the metrics rank's
tokens; ranks of a data-parallel layout evaluate disjoint shards.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any

import torch

from qwen3_trn.common.errors import ConfigError
from qwen3_trn.config.schema import DataConfig, ValidationConfig
from qwen3_trn.data.sources import resolve_validation_dataset
from qwen3_trn.titan import DATASETS, HuggingFaceTextDataLoader, Validator

# torchtitan's name of the held-out loss (val_loss in metrics.jsonl, wandb and summary.json)
VALIDATION_LOSS = "validation_metrics/loss"


def is_validation_step(step: int, interval: int, last_step: int) -> bool:
    """torchtitan's schedule (step 1 and every ``interval`` steps) plus the run's last step."""
    return step == 1 or step % interval == 0 or step == last_step


def validation_record(metrics: dict[str, Any]) -> dict[str, float]:
    """The held-out figures of one validation, named as in metrics.jsonl."""
    loss = float(metrics[VALIDATION_LOSS])
    return {"val_loss": loss, "val_perplexity": math.exp(min(loss, 700.0))}


class RunValidator(Validator):
    @dataclass(kw_only=True, slots=True)
    class Config(Validator.Config):
        last_step: int = 0
        """Also validate at this step (the run's last); 0: torchtitan's schedule only."""

        # (not named seq_len / local_batch_size: the trainer passes those to build())
        row_len: int | None = None
        """Tokens per validation row; None: the training sequence length."""

        rows: int | None = None
        """Rows per validation batch; None: the training batch size."""

    def __init__(self, config: Config, *, seq_len: int, local_batch_size: int, **kwargs: Any) -> None:
        super().__init__(
            config,
            seq_len=config.row_len or seq_len,
            local_batch_size=config.rows or local_batch_size,
            **kwargs,
        )
        self._checked = False
        self._digest = hashlib.sha256()
        self._tokens = 0

    def should_validate(self, step: int) -> bool:
        return is_validation_step(step, self.config.freq, self.config.last_step)

    def post_dataloading_process(self, input_dict, labels, model_parts):
        for ids in (input_dict["input"], labels):
            self._digest.update(ids.detach().to("cpu", torch.int64).contiguous().numpy().tobytes())
        self._tokens += labels.numel()
        return super().post_dataloading_process(input_dict, labels, model_parts)

    def validate(self, model_parts, step: int) -> None:
        if not self._checked:  # here rather than at build time, so that a broken training source fails first
            _check_not_empty(self.config.dataloader)
            self._checked = True
        self._digest, self._tokens = hashlib.sha256(), 0
        super().validate(model_parts, step)
        record = getattr(self.metrics_processor, "record_validation_tokens", None)
        if record is not None:  # the project's RunMetricsProcessor (torchtitan's own has no such record)
            record(self._digest.hexdigest(), self._tokens)


def _check_not_empty(dataloader: HuggingFaceTextDataLoader.Config) -> None:
    """A held-out split with no documents would make torchtitan's looping loader spin forever."""
    entry = DATASETS.get(dataloader.dataset.lower())
    if entry is None:
        return  # torchtitan's own loader raises its clear "not supported" error
    dataset = entry.loader(dataloader.dataset_path or entry.path)
    if hasattr(dataset, "__len__") and len(dataset) == 0:
        raise ValueError(
            f"the validation split ({dataloader.dataset_path or dataloader.dataset}) holds no documents: "
            "give held-out text with data.val_path, raise data.val_fraction, or turn validation off (validation=off)."
        )


def check_validation(validation: ValidationConfig, training_seq_len: int, max_seq_len: int, pipeline_parallel: bool) -> None:
    """ConfigErrors for the validation group, before any worker starts."""
    if not validation.enable:
        return
    if validation.interval < 1:
        raise ConfigError("validation.interval", f"must be >= 1 (validate every n steps), got {validation.interval}; or validation=off.")
    if validation.steps < 1 and validation.steps != -1:
        raise ConfigError("validation.steps", f"must be >= 1 batches, or -1 for the whole held-out split; got {validation.steps}.")
    for key in ("seq_len", "local_batch_size"):
        value = getattr(validation, key)
        if value is not None and value < 1:
            raise ConfigError(f"validation.{key}", f"must be >= 1 (or null: the training value), got {value}.")
    seq_len = validation.seq_len or training_seq_len
    if seq_len > max_seq_len:
        raise ConfigError(
            "validation.seq_len", f"{seq_len} is above the model's max_seq_len {max_seq_len}; lower it or raise model.max_seq_len."
        )
    if pipeline_parallel and (validation.seq_len or validation.local_batch_size):
        key = "validation.seq_len" if validation.seq_len else "validation.local_batch_size"
        raise ConfigError(
            key,
            "under pipeline parallelism validation runs through the training schedule, whose microbatch shapes "
            "are fixed; leave validation.seq_len and validation.local_batch_size unset (null).",
        )


def validator_config(validation: ValidationConfig, data: DataConfig, last_step: int, num_workers: int = 0) -> Validator.Config:
    """torchtitan's validator config for the run (disabled when validation=off)."""
    if not validation.enable:
        return Validator.Config(enable=False)
    dataset = resolve_validation_dataset(data)
    return RunValidator.Config(
        enable=True,
        freq=validation.interval,
        steps=validation.steps,
        last_step=last_step,
        row_len=validation.seq_len,
        rows=validation.local_batch_size,
        dataloader=HuggingFaceTextDataLoader.Config(
            dataset=dataset.name, dataset_path=dataset.path, num_workers=num_workers, infinite=False
        ),
    )
