"""``data=hub``: a Hugging Face dataset by id (network or the local HF cache), opened in the
parent before a training run's ranks start."""

from __future__ import annotations

import logging
import os
from functools import partial

from datasets import load_dataset, load_dataset_builder

from qwen3_trn.common.errors import ConfigError, first_line
from qwen3_trn.common.quiet import logging_disabled
from qwen3_trn.config.keys import hint_of
from qwen3_trn.config.option_schemas import HubSourceConfig
from qwen3_trn.config.schema import Mode
from qwen3_trn.data.sources.base import Documents, SplitSource


def _load_hub(subset: str | None, split: str, streaming: bool, path: str):
    return load_dataset(path, name=subset, split=split, streaming=streaming)


class HubSource(SplitSource):
    Config = HubSourceConfig

    config: Config
    held_out_keys = ("data.val_split",)

    def documents(self, split: str | None = None) -> Documents:
        data = self.config
        if not data.path:
            raise ConfigError("data.path", f"{hint_of(HubSourceConfig, 'path')}.")
        return Documents(data.path, partial(_load_hub, data.subset, split or data.split, data.streaming), data.text_column)

    def own_held_out(self) -> Documents | None:
        return self.documents(split=self.config.val_split) if self.config.val_split else None

    def check(self, mode: Mode) -> None:
        if mode != Mode.train:
            return  # planning needs no network
        data = self.config
        try:
            with logging_disabled(logging.CRITICAL):
                builder = load_dataset_builder(data.path, name=data.subset)
        except Exception as exc:  # noqa: BLE001 - hub, network and cache errors alike
            reason = first_line(exc)
            offline = " (HF_DATASETS_OFFLINE is set: only the local cache was searched)" if os.environ.get("HF_DATASETS_OFFLINE") else ""
            raise ConfigError(
                "data.path",
                f"cannot open the hub dataset '{data.path}'{offline}: {reason}; check the id, the network and HF_TOKEN for gated datasets.",
            ) from None
        features = builder.info.features
        if features is not None and data.text_column not in features:
            raise ConfigError(
                "data.text_column",
                f"'{data.text_column}' is not a column of '{data.path}': it has "
                f"{', '.join(features)}; set data.text_column=<the column with the text>.",
            )
