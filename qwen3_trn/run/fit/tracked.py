"""Rank 0's memory over real training steps, measured by PyTorch's ``FSDPMemTracker``.

torchtitan's Trainer builds rank 0 of the layout on its fake collective backend and, once the
model is materialized, runs under ``FakeTensorMode``, so nothing is allocated. The second of two
steps is measured (the first creates the optimizer states). Runs in a process of its own
(``python -m qwen3_trn.rank <config> --check``). Deep models are measured at two cut depths
and extrapolated: every block adds the same bytes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

from qwen3_trn.backends import Backend, build_backend
from qwen3_trn.common.local_tensors import local_tensor
from qwen3_trn.config.schema import RunConfig
from qwen3_trn.devices import probe_device
from qwen3_trn.run.convert import compute_dtype, to_trainer_config
from qwen3_trn.run.fit.layers import rank0_layers
from qwen3_trn.run.fit.memory import MemoryEstimate
from qwen3_trn.run.fit.trackers import by_category, for_torchtitan_step
from qwen3_trn.run.layout import Layout
from qwen3_trn.titan import dist_utils, grads_set_to_none

# Deeper models are measured at these two depths (x the pipeline degree) and extrapolated.
CUT_DEPTHS = (2, 3)
_PARAMS = ("Sharded Param", "Buffer")
_GRADS = ("Sharded Grad",)
_OPT = ("OptState",)
_COMM = ("Unsharded Param", "Unsharded Grad", "All Gather", "Reduce Scatter")


@dataclass(frozen=True)
class TrackedStep:
    """Byte counts of rank 0 for one depth of the model."""

    layers: int
    params: int
    grads: int
    optimizer: int
    fwd_bwd_peak: int
    fsdp_buffers: int
    step_peak: int
    seconds: float

    def linear(self, other: TrackedStep, layers: int) -> TrackedStep:
        """The figures at ``layers`` blocks, on the line through ``self`` and ``other``."""
        span = other.layers - self.layers

        def at(name: str) -> int:
            a, b = getattr(self, name), getattr(other, name)
            return round(a + (b - a) * (layers - self.layers) / span)

        names = ("params", "grads", "optimizer", "fwd_bwd_peak", "fsdp_buffers", "step_peak")
        return TrackedStep(layers=layers, seconds=self.seconds + other.seconds, **{name: at(name) for name in names})


def _entering(stack: contextlib.ExitStack, mode: FakeTensorMode, build: Callable) -> Callable:
    """``build`` (torchtitan's parallelize or pipelining function), after which fake mode is on.
    FSDP's and DeviceMesh's init read tensor values fake tensors lack, so they run on the meta model;
    the Trainer then materializes and steps it under fake mode."""

    def wrapped(*args: Any, **kwargs: Any):
        result = build(*args, **kwargs)
        stack.enter_context(mode)
        return result

    return wrapped


def _batches(trainer, count: int) -> list:
    with unset_fake_temporarily():  # the dataloader's sampling reads real tensor values
        iterator = iter(trainer.dataloader)
        return [next(iterator) for _ in range(count)]


def _forward_backward(trainer, microbatches: list) -> None:
    """The trainer's forward/backward, fed as ``Trainer.train_step`` feeds it (which itself logs
    ``int(local_valid_tokens)``, a value fake tensors lack)."""
    with unset_fake_temporarily():
        tokens = torch.tensor(sum(labels.numel() for _, labels in microbatches))
    if trainer.parallel_dims.pp_enabled:
        trainer.forward_backward_step(
            input_dict=[dict(inputs) for inputs, _ in microbatches],
            labels=[labels for _, labels in microbatches],
            global_valid_tokens=tokens,
        )
    else:
        ((inputs, labels),) = microbatches
        trainer.forward_backward_step(input_dict=dict(inputs), labels=labels, global_valid_tokens=tokens)


def _optimizer_step(trainer) -> None:
    dist_utils.clip_grad_norm_(
        [p for m in trainer.model_parts for p in m.parameters()],
        trainer.config.training.max_norm,
        foreach=True,
        pp_mesh=trainer.parallel_dims.get_optional_mesh("pp"),
        ep_enabled=trainer.parallel_dims.ep_enabled,
    )
    trainer.optimizers.step()


def _tracker(trainer) -> FSDPMemTracker:
    (model,) = trainer.model_parts
    (optimizer,) = trainer.optimizers.optimizers
    return for_torchtitan_step(FSDPMemTracker(model, optimizer))


def _sum(totals: dict[str, int], names: tuple[str, ...]) -> int:
    return sum(totals.get(name, 0) for name in names)


@contextlib.contextmanager
def fake_trainer(cfg: RunConfig, layout: Layout) -> Iterator:
    """torchtitan's Trainer for rank 0 of ``layout`` on the fake backend, materialized under
    FakeTensorMode, which stays on inside the block."""
    world = layout.world_size
    os.environ.update({"NGPU": str(world), "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": str(world)})
    cpu = probe_device("cpu")
    cpu.activate(compute_dtype(cfg, cpu))  # as worker.build_trainer does for a rank
    backend = build_backend(cfg.backend)  # this process's one (each build runs in a process of its own)
    backend.prepare_process(cfg, cpu)
    trainer_config = to_trainer_config(cfg, cpu, layout, backend)
    trainer_config.comm.mode = "fake_backend"
    trainer_config.metrics.console_progress = False
    trainer_config.metrics.log_freq = 1 << 30
    trainer_config.checkpoint.enable = False
    stack = contextlib.ExitStack()
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    spec = trainer_config.model_spec
    if layout.pp > 1:
        trainer_config.model_spec = dataclasses.replace(spec, pipelining_fn=_entering(stack, fake, spec.pipelining_fn))
    else:
        trainer_config.model_spec = dataclasses.replace(spec, parallelize_fn=_entering(stack, fake, spec.parallelize_fn))
    trainer = None
    with tempfile.TemporaryDirectory(prefix="qwen3_trn_fit_") as scratch, stack:
        trainer_config.dump_folder = scratch
        trainer_config.metrics.run_dir = scratch
        try:
            trainer = trainer_config.build()
            yield trainer
        finally:
            if trainer is not None:
                trainer.close()
            if torch.distributed.is_initialized():
                torch.distributed.destroy_process_group()


def rank0_parameters(cfg: RunConfig, layout: Layout) -> tuple[int, int]:
    """Parameters of the model and of rank 0's shards, from the fake-built trainer."""
    with fake_trainer(cfg, layout) as trainer:
        parameters = [p for m in trainer.model_parts for p in m.parameters()]
        total = sum(p.numel() for p in parameters)
        local = sum(local_tensor(p).numel() for p in parameters)
    return total, local


def trainer_flops_per_token(cfg: RunConfig, layout: Layout) -> int:
    """The FLOPs per token torchtitan's Trainer computes for its MFU."""
    with fake_trainer(cfg, layout) as trainer:
        return trainer.metrics_processor.num_flops_per_token


def _track(cfg: RunConfig, layout: Layout) -> TrackedStep:
    started = time.perf_counter()
    with fake_trainer(cfg, layout) as trainer:
        microbatches = _batches(trainer, trainer.num_pipeline_parallel_microbatches)
        set_to_none = grads_set_to_none(trainer.config.training)
        # The first step creates the optimizer states, untracked: under FakeTensorMode the
        # tracker books phantom temporaries to that first optimizer step (a real run measured
        # with the same tracker, and torch's profiler, show none; see docs/fit.md).
        trainer.optimizers.zero_grad(set_to_none=set_to_none)
        _forward_backward(trainer, microbatches)
        _optimizer_step(trainer)
        steady = _tracker(trainer)
        with steady:
            trainer.optimizers.zero_grad(set_to_none=set_to_none)
            _forward_backward(trainer, microbatches)
            at_fwd_bwd_peak = by_category(steady.get_tracker_snapshot("peak"))
            _optimizer_step(trainer)
            after = by_category(steady.get_tracker_snapshot("current"))
        step_peak = by_category(steady.get_tracker_snapshot("peak"))["Total"]
        layers = len(rank0_layers(cfg.model, layout, trainer.config))
    return TrackedStep(
        layers=layers,
        params=_sum(after, _PARAMS),
        grads=_sum(after, _GRADS),
        optimizer=_sum(after, _OPT),
        fwd_bwd_peak=at_fwd_bwd_peak["Total"],
        fsdp_buffers=_sum(at_fwd_bwd_peak, _COMM),
        step_peak=step_peak,
        seconds=time.perf_counter() - started,
    )


def isolated(fn: Callable, *args: Any):
    """``fn(*args)`` in a child process: a second fake trainer in one process fails FSDP's mesh
    check under TP (torch keeps the first build's meshes). Children fork from a server that never
    ran autograd (its threads do not survive a fork), so each starts in well under a second."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__])
    with ProcessPoolExecutor(max_workers=1, mp_context=context, max_tasks_per_child=1) as pool:
        return pool.submit(_reraisable, fn, *args).result()


def _reraisable(fn: Callable, *args: Any):
    """``fn(*args)``, its exception (not always picklable) made one that crosses processes."""
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - re-raised with its type and message
        raise RuntimeError(f"{type(exc).__name__}: {exc}") from None


def untrackable(layout: Layout) -> str | None:
    """Why the tracker cannot measure this layout, if it cannot."""
    if layout.ep > 1:
        return "expert parallel's all-to-all reads the token counts per expert on the host, which FakeTensorMode does not have"
    if layout.pp > 1:
        return "pipeline stages infer their shapes by communicating, which torchtitan's fake backend cannot"
    return None


def measure(cfg: RunConfig, layout: Layout, backend: Backend, n_layers: int) -> tuple[TrackedStep, list[int]]:
    """Rank 0's tracked step at the config's depth (cut depths measured and extrapolated when
    deeper). Returns the figures and the depths measured."""
    depths = [depth * layout.pp for depth in CUT_DEPTHS]
    if n_layers <= depths[-1]:
        return isolated(_track, cfg, layout), [n_layers]
    steps = []
    for depth in depths:
        cut = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, n_layers=depth))
        steps.append(isolated(_track, cut, layout))
    full_layers = len(rank0_layers(cfg.model, layout, to_trainer_config(cfg, probe_device("cpu"), layout, backend), n_layers))
    return steps[0].linear(steps[1], full_layers), depths


def tracked_estimate(cfg: RunConfig, layout: Layout, backend: Backend, n_layers: int, margin: Callable[[int], int]) -> MemoryEstimate:
    step, depths = measure(cfg, layout, backend, n_layers)
    persistent = step.params + step.grads + step.optimizer
    return MemoryEstimate(
        params=step.params,
        grads=step.grads,
        optimizer=step.optimizer,
        activations=max(step.fwd_bwd_peak - persistent - step.fsdp_buffers, 0),
        fsdp_buffers=step.fsdp_buffers,
        peak=step.step_peak,
        margin=margin(step.step_peak),
        source="tracker",
        detail={"depths_measured": depths, "seconds": round(step.seconds, 1), "fwd_bwd_peak": step.fwd_bwd_peak},
    )
