"""Trainium (torch-neuronx) rules a run follows, from AWS's public source and docs
(docs/hardware.md, "On Trainium"): compile options, the shared NEFF cache, and one rank per
packed job.
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
    """``compile_fn`` with ``fullgraph=True`` and ``dynamic=False`` whatever the caller asked:
    torch-neuronx rejects ``dynamic=True`` and recommends ``fullgraph=True``."""
    if getattr(compile_fn, "neuron_compile_rules", False):
        return compile_fn

    @functools.wraps(compile_fn)
    def compile(model: Any = None, **options: Any) -> Any:
        return compile_fn(model, **{**options, **COMPILE_OPTIONS})

    compile.neuron_compile_rules = True  # type: ignore[attr-defined]
    return compile


def apply_compile_rules() -> None:
    """Make every ``torch.compile`` of this process (``nn.Module.compile`` too) follow Neuron's rules."""
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
    """The NEFF cache under ``shared_dir``, shared by every rank of the job and its sweep, so a graph
    compiled once is loaded by the rest."""
    return {NEFF_CACHE_ENV: str(Path(shared_dir) / NEFF_CACHE_FOLDER)}


def packing_refusal(devices_per_job: int, nproc_per_node: int) -> str | None:
    """Why a packed Neuron job of this size cannot run, or None.

    torch-neuronx pins a rank to ``neuron:LOCAL_RANK`` and asserts it sees one core
    (``torch_neuronx/distributed/backend.py``: ``_neuron_runtime_setup``), while torchtitan picks
    ``neuron:0`` where one core is visible; both hold only for one rank on one core."""
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
