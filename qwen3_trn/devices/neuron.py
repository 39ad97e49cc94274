"""Trainium (torch-neuronx) rules a run follows, from AWS's public torch-neuronx source and docs.

- torch.compile: torch-neuronx's compile reference says ``dynamic=True`` is rejected during
  compilation (shapes that vary recompile, one static graph each) and recommends
  ``fullgraph=True``; torchtitan compiles its blocks with ``fullgraph=True`` but its loss with
  neither, so a Neuron rank compiles everything with both fixed (``apply_compile_rules``).
- The NEFF cache: compiled programs go to ``TORCH_NEURONX_NEFF_CACHE_DIR``; every rank of a job
  (every node, and every job of a sweep) is pointed at one directory on the shared filesystem,
  so a graph compiled once is loaded by the rest.
- Packing: after the process group starts, torch-neuronx's ``_neuron_runtime_setup``
  (``torch_neuronx/distributed/backend.py``) sets the local device start index to LOCAL_RANK
  (``torch_neuronx._C._set_local_device_start_index``), so the device a rank may use is
  ``neuron:LOCAL_RANK`` (``set_device`` and ``get_vnc_id`` in ``csrc/core/NeuronDevice.cpp``
  refuse any other), and it asserts that the process sees one core (``_vnc_count() == 1``).
  torchtitan picks ``neuron:0`` where one core is visible (``tools.utils.get_local_device``) and
  ``neuron:LOCAL_RANK`` only where several are, which fails that assert. Both hold only for a rank
  of LOCAL_RANK 0 that sees one core: a packed job of one rank on one core
  (``packing_refusal``).
"""

from __future__ import annotations

import functools
import importlib
from pathlib import Path
from typing import Any, Callable

import torch

COMPILE_OPTIONS: dict[str, Any] = {"fullgraph": True, "dynamic": False}
NEFF_CACHE_ENV = "TORCH_NEURONX_NEFF_CACHE_DIR"
NEFF_CACHE_FOLDER = "neff_cache"
VISIBLE_CORES_ENV = "NEURON_RT_VISIBLE_CORES"


def with_compile_rules(compile_fn: Callable[..., Any]) -> Callable[..., Any]:
    """``compile_fn`` (``torch.compile``) with Neuron's options, whatever the caller asked."""
    if getattr(compile_fn, "neuron_compile_rules", False):
        return compile_fn

    @functools.wraps(compile_fn)
    def compile(model: Any = None, **options: Any) -> Any:
        return compile_fn(model, **{**options, **COMPILE_OPTIONS})

    compile.neuron_compile_rules = True  # type: ignore[attr-defined]
    return compile


def apply_compile_rules() -> None:
    """Every ``torch.compile`` of this process (``nn.Module.compile`` calls it too) follows Neuron's rules."""
    torch.compile = with_compile_rules(torch.compile)


def activate(compute_dtype: str = "float32") -> None:
    # torch-neuronx registers the "neuron" device and process-group backend on import;
    # torchtitan-neuron, when installed, adds its models and Neuron-specific components.
    importlib.import_module("torch_neuronx")
    try:
        importlib.import_module("torchtitan_neuron")
    except ImportError:
        pass
    apply_compile_rules()


def neff_cache_env(shared_dir: Path) -> dict[str, str]:
    """The NEFF cache every rank of the job (and of its sweep) shares, under ``shared_dir``."""
    return {NEFF_CACHE_ENV: str(Path(shared_dir) / NEFF_CACHE_FOLDER)}


def packing_refusal(devices_per_job: int, nproc_per_node: int) -> str | None:
    """Why a packed Neuron job of this size cannot run (module docstring), or None."""
    if devices_per_job == 1 and nproc_per_node == 1:
        return None
    return (
        f"a packed Neuron job runs one rank on one NeuronCore (launcher.devices_per_job=1, launcher.nproc_per_node=1), "
        f"not {nproc_per_node} rank(s) on {devices_per_job} core(s): torch-neuronx's process group "
        f"(torch_neuronx/distributed/backend.py, _neuron_runtime_setup) sets each rank's device start index to its LOCAL_RANK "
        f"and asserts that it sees one core, while torchtitan gives a rank that sees one core neuron:0, so "
        f"{VISIBLE_CORES_ENV} narrowed to a core agrees for LOCAL_RANK 0 only and a wider slice fails the one-core assert. "
        "Give each job one core and one rank, or turn packing off (launcher.devices_per_job=0) and run the job alone on the instance"
    )
