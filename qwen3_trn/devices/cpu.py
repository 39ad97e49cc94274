"""CPU adapter: the torchtitan 0.3 behaviours that assume an accelerator, adapted for CPU.

Applied only when the resolved device is ``cpu``; each adaptation names what it works around.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import platform
import time
from pathlib import Path
from types import SimpleNamespace

import torch
from torch.distributed.fsdp import FSDPModule
from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter  # what set_custom_reduce_scatter takes

from qwen3_trn.common.allocator import retain_freed_memory
from qwen3_trn.results.records import cache_dir, write_json_atomic
from qwen3_trn.titan import ModelSpec

_PROC_STATUS = Path("/proc/self/status")
_PROC_CLEAR_REFS = Path("/proc/self/clear_refs")


def _peak_rss_bytes() -> int:
    """Peak resident set size of this process since the last reset (Linux VmHWM)."""
    try:
        for line in _PROC_STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def has_native_bf16() -> bool:
    """AMX or AVX512-BF16: without them bf16 matmuls are emulated and far slower than fp32."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags


def _total_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


class CpuDeviceModule:
    """The ``torch.cuda``-style calls torchtitan's trainer and ``DeviceMemoryMonitor`` make on
    ``device_module`` (``torch.cpu`` lacks most). Peak RSS stands in for peak allocation."""

    def set_device(self, device) -> None:  # one CPU "device"; nothing to select
        pass

    def device_count(self) -> int:
        return 1

    def current_device(self) -> int:
        return 0

    def get_device_name(self, device=None) -> str:
        return platform.processor() or platform.machine() or "cpu"

    def get_device_properties(self, device=None):
        return SimpleNamespace(total_memory=_total_memory_bytes(), name=self.get_device_name())

    def reset_peak_memory_stats(self, device=None) -> None:
        # Writing 5 to clear_refs resets VmHWM to the current RSS (Linux >= 4.0).
        try:
            _PROC_CLEAR_REFS.write_text("5")
        except OSError:
            pass

    def empty_cache(self) -> None:
        pass

    def synchronize(self, device=None) -> None:
        pass

    def memory_stats(self, device=None) -> dict[str, int]:
        peak = _peak_rss_bytes()
        return {
            "active_bytes.all.peak": peak,
            "reserved_bytes.all.peak": peak,
            "num_alloc_retries": 0,
            "num_ooms": 0,
        }

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def is_available(self) -> bool:
        return True


# torchtitan resolves ``device_type = _get_available_device_type() or "cuda"`` at import
# time and several modules copy the names; each of these must see "cpu".
_MODULES_HOLDING_DEVICE_NAMES = (
    "torchtitan.tools.utils",
    "torchtitan.components.metrics",
    "torchtitan.distributed.utils",
    "torchtitan.distributed.parallel_dims",
    "torchtitan.models.common.token_dispatcher",
    "torchtitan.tools.profiler",
)


@functools.cache
def measured_peak_flops(dtype_name: str) -> float:
    """Dense matmul FLOP/s this CPU reaches in ``dtype_name``, measured once and cached: torchtitan
    has no CPU peak and falls back to an A100's, which makes MFU meaningless here."""
    key = f"{platform.processor() or platform.machine()}|{torch.__version__}|{torch.get_num_threads()}|{dtype_name}"
    cache = cache_dir() / "cpu_peak_flops.json"
    try:
        known = json.loads(cache.read_text())
    except (OSError, ValueError):
        known = {}
    if key in known:
        return float(known[key])
    dtype = getattr(torch, dtype_name)
    n = 2048 if dtype == torch.bfloat16 else 1024
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    torch.mm(a, b)
    iters, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < 0.3:
        torch.mm(a, b)
        iters += 1
    peak = 2 * n**3 * iters / elapsed
    known[key] = peak
    try:
        write_json_atomic(cache, known)
    except OSError:
        pass
    return peak


def activate(compute_dtype: str = "float32") -> None:
    """Point torchtitan at the CPU. Idempotent."""
    import importlib

    retain_freed_memory()

    module = CpuDeviceModule()
    for name in _MODULES_HOLDING_DEVICE_NAMES:
        mod = importlib.import_module(name)
        if hasattr(mod, "device_type"):
            mod.device_type = "cpu"
        if hasattr(mod, "device_module"):
            mod.device_module = module

    # MFU: replace the A100 fallback with this machine's measured peak.
    peak = measured_peak_flops(compute_dtype)
    importlib.import_module("torchtitan.tools.utils").get_peak_flops = lambda device_name: peak


class ReduceInPlaceAtOneRank(ReduceScatter):
    """FSDP2's reduce-scatter at one rank, without its copy.

    At one rank ``foreach_reduce`` copies the flat reduce-scatter input into an output of the same
    size; handing back the input as the output makes the copy a no-op: one full-size buffer and one
    pass over every gradient fewer per step (the largest part of a debugmodel_moe step,
    benchmarks/moe_profile.py). Nothing writes to the input after, so sharing it is safe."""

    def __init__(self) -> None:
        self._input: torch.Tensor | None = None

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        pending, self._input = self._input, None
        if pending is not None and pending.dtype == dtype and tuple(pending.shape) == tuple(size):
            return pending  # the output, asked for right after the input
        self._input = torch.empty(*size, dtype=dtype, device=device)
        return self._input

    def __call__(self, output_tensor, input_tensor, group, op, async_op: bool = False):
        raise RuntimeError("ReduceInPlaceAtOneRank serves one-rank FSDP only, which never reduce-scatters")


def _adapt_fsdp(parallelize_fn):
    """Make FSDP reduce with a plain SUM: torchtitan's ``set_gradient_divide_factor(1.0)`` makes it
    use ``PREMUL_SUM``, which gloo rejects, and at one rank materialise ``grads / 1.0`` every step.
    The gradients stay bit-identical (torchtitan already scales the loss by the global token count)."""

    @functools.wraps(parallelize_fn)
    def parallelize(model, **kwargs):
        model = parallelize_fn(model, **kwargs)
        one_rank = torch.distributed.get_world_size() == 1
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_force_sum_reduction_for_comms(True)
                if one_rank:
                    module.set_gradient_divide_factor(None)
                    module.set_custom_reduce_scatter(ReduceInPlaceAtOneRank())
        return model

    return parallelize


def adapt_model_spec(spec: ModelSpec) -> ModelSpec:
    return dataclasses.replace(spec, parallelize_fn=_adapt_fsdp(spec.parallelize_fn))
