"""Activation memory per micro-batch, measured on torchtitan's model under FakeTensorMode.

The run's model config is cut to two blocks and run forward, chunked loss and backward inside
PyTorch's ``MemTracker``: what the second block leaves saved is what each further block adds.
Nothing is allocated and no process group is needed; results are cached on disk.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.mem_tracker import MemTracker, _ModState

from qwen3_trn.results.records import cache_dir, read_json, write_json_atomic
from qwen3_trn.run.fit.trackers import by_category, for_torchtitan_step
from qwen3_trn.titan import (
    TORCH_DTYPE_MAP,
    BaseLoss,
    Qwen3Model,
    ScaledDotProductAttention,
    apply_activation_checkpointing,
    build_loss,
    loss_value,
    set_default_dtype,
    torchtitan_version,
)

PROBE_LAYERS = 2
# Categories that are not activations: the probe's own (compute-dtype) weights and their grads.
_WEIGHTS = ("Parameter", "Buffer", "Gradient", "Optstate")


@dataclass(frozen=True)
class ActivationProfile:
    """Forward/backward activation peak of one micro-batch: ``fixed + per_layer x layers``."""

    per_layer: int
    fixed: int
    batch: int
    seq_len: int

    def peak(self, layers: int) -> int:
        return self.fixed + self.per_layer * layers


def _cache_file() -> Path:
    return cache_dir() / "fit_activations.json"


def _cut(model_config: Qwen3Model.Config, layers: int) -> Qwen3Model.Config:
    """The config's first ``layers`` blocks with SDPA attention: FlexAttention has no CPU backward,
    and its memory, like SDPA's flash kernel, grows linearly in the sequence."""
    config = dataclasses.replace(model_config, layers=copy.deepcopy(model_config.layers[:layers]))
    for layer in config.layers:
        layer.attention.inner_attention = ScaledDotProductAttention.Config()
    return config


def _activations(snapshot: dict) -> int:
    totals = by_category(snapshot)
    return totals["Total"] - sum(totals.get(name, 0) for name in _WEIGHTS)


def _measure(
    model_config, ac_config, loss_config: BaseLoss.Config | None, dtype: torch.dtype, batch: int, seq_len: int
) -> ActivationProfile:
    """One forward, loss and backward of the two-block model: the peak, and what the second
    block's forward saved on top of the first's."""
    with torch.device("meta"), set_default_dtype(dtype):
        model = model_config.build()
    if ac_config is not None:
        apply_activation_checkpointing(model, ac_config)
    loss_fn = build_loss(loss_config)
    with FakeTensorMode(allow_non_fake_inputs=True):
        model.to_empty(device="cpu")
        if hasattr(loss_fn, "set_lm_head"):
            loss_fn.set_lm_head(model.lm_head)
            model._skip_lm_head = True
        tokens = torch.randint(0, model_config.vocab_size, (batch, seq_len))
        labels = torch.randint(0, model_config.vocab_size, (batch, seq_len))
        tracker = for_torchtitan_step(MemTracker())
        tracker.track_external(model)
        with tracker:
            pred = model(tokens)
            loss = loss_value(loss_fn(pred, labels, torch.tensor(batch * seq_len)))
            del pred
            loss.backward()
    blocks = list(model.layers.values())
    after = [_activations(tracker.memory_tracking[block].snapshots[_ModState.POST_FW][0]) for block in blocks]
    per_layer = after[-1] - after[-2] if len(after) > 1 else after[0]
    peak = _activations(tracker.get_tracker_snapshot("peak"))
    return ActivationProfile(per_layer=per_layer, fixed=max(peak - per_layer * len(blocks), 0), batch=batch, seq_len=seq_len)


# "<function f.<locals>.g at 0x7f...>" (the model config's ``param_init`` closures, as its
# ``to_dict`` writes them): the address differs in every process, the rest does not.
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _key(model_config, ac_config, loss_config, dtype: torch.dtype, batch: int, seq_len: int) -> str:
    """The profile's cache key, the same in every process for the same model, activation
    checkpointing, loss, dtype and micro-batch."""
    described = json.dumps(
        [
            model_config.to_dict(),
            repr(ac_config),
            repr(loss_config),
            str(dtype),
            batch,
            seq_len,
            torch.__version__,
            torchtitan_version(),
        ],
        sort_keys=True,
        default=repr,
    )
    return hashlib.sha256(_ADDRESS.sub("", described).encode()).hexdigest()[:24]


def activation_profile(
    model_config: Qwen3Model.Config, ac_config, loss_config: BaseLoss.Config | None, compute_dtype: str, batch: int, seq_len: int
) -> ActivationProfile:
    """Measured (or cached) activation profile of ``batch x seq_len`` tokens per micro-batch."""
    dtype = TORCH_DTYPE_MAP[compute_dtype]
    key = _key(model_config, ac_config, loss_config, dtype, batch, seq_len)
    cache = _cache_file()
    known = read_json(cache) or {}
    if key in known:
        return ActivationProfile(**known[key])
    profile = _measure(_cut(model_config, PROBE_LAYERS), ac_config, loss_config, dtype, batch, seq_len)
    # read again: another process may have added its own profile since
    known = {**(read_json(cache) or {}), key: dataclasses.asdict(profile)}
    try:
        write_json_atomic(cache, known)
    except OSError:
        pass
    return profile
