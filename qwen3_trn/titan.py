"""Every torchtitan name the project uses, imported here and nowhere else in the package.

On trn2, ``torchtitan`` is the package torchtitan-neuron's install provides: a fork of an early
2026 snapshot, which may lack names upstream added later (the project is written against
upstream 0.3.0). Instead of an ImportError from deep inside a module, importing this one raises
:class:`TorchtitanMismatch`: every missing name at once and the torchtitan version found. The
entry point reports it like any other bad input (exit 2) before anything starts.

The ``from torchtitan... import`` statements of the ``try`` block below are the list: when one
fails, each name of each statement is looked up on its own (:func:`missing_names`).
``FIELDS`` are the fields the project sets that the issue tracker found upstream added later.

The fork's source was not found (only the Neuron documentation and the seed article, which
uses ``torchtitan.config.CompileConfig``, ``torchtitan.models.qwen3.model_registry``,
``torchtitan.trainer.Trainer`` and the transformers backend's ``TransformersBackendConfig`` as
upstream 0.3 names them). The differences known are handled where they matter: the fork compiles
``grad_clip`` (:func:`compiled_components`), and it still accepts ``attn_backend="sdpa"``, which
upstream refuses; the project passes neither that nor anything else that differs (SDPA is set
as the layers' inner attention, ``qwen3_trn.models.attention``), so it runs on both.
"""

# ruff: noqa: F401 - the names are imported here for the rest of the package

from __future__ import annotations

import ast
import dataclasses
import importlib
import importlib.metadata
import importlib.util
from pathlib import Path

from qwen3_trn.errors import ConfigError

# Config dataclass -> fields the project passes to it by name, added to upstream in 2026.
FIELDS: dict[str, tuple[str, ...]] = {
    "torchtitan.config.TrainingConfig": ("disable_cuda_graphs",),
}

# The components upstream torchtitan 0.3 compiles when they are in ``compile.components``:
# "model" (models/*/parallelize.py) and "loss" (components/loss.py). Other names are accepted
# by its CompileConfig and ignored.
COMPILED_COMPONENTS = ("model", "loss")
# torchtitan-neuron's fork also compiles gradient clipping, as the seed article says ("add
# grad_clip to CompileConfig.components when torch.compile is on"); its source was not found.
NEURON_FORK_COMPILED_COMPONENTS = (*COMPILED_COMPONENTS, "grad_clip")


class TorchtitanMismatch(ConfigError):
    """The installed torchtitan lacks names the project imports."""

    def __init__(self, missing: list[str], version: str, cause: ImportError | None = None) -> None:
        self.missing = missing
        self.version = version
        first_error = f" (the first import failed with: {cause})" if cause is not None else ""
        super().__init__(
            "torchtitan",
            f"the installed torchtitan {version} lacks {', '.join(missing)}, which this project uses "
            "(it is written against upstream torchtitan 0.3.0). On trn2 the `torchtitan` package comes from "
            "torchtitan-neuron's fork (its `pip install -e .` provides it); install a torchtitan-neuron release "
            "that has these names, or upstream torchtitan==0.3.0 where the Neuron fork is not needed" + first_error + ".",
        )


def compiled_components() -> tuple[str, ...]:
    """The ``compile.components`` the installed torchtitan compiles (the fork: where
    torchtitan-neuron, whose install provides it, is importable)."""
    return NEURON_FORK_COMPILED_COMPONENTS if importlib.util.find_spec("torchtitan_neuron") else COMPILED_COMPONENTS


def _distribution_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def torchtitan_version() -> str:
    """The installed torchtitan's version (``torchtitan.__version__`` when it is not installed as a
    distribution of its own), and torchtitan-neuron's where that is installed (it provides torchtitan)."""
    version = _distribution_version("torchtitan")
    if version is None:
        try:
            version = str(getattr(importlib.import_module("torchtitan"), "__version__", "(unknown version)"))
        except ImportError:
            version = "(not installed)"
    fork = _distribution_version("torchtitan-neuron")
    return f"{version} (torchtitan-neuron {fork})" if fork else version


def imported_names(source: str) -> list[tuple[str, str]]:
    """(module, name) of each ``from torchtitan... import`` statement in ``source``'s top-level ``try``."""
    names = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.Try):
            for statement in node.body:
                if isinstance(statement, ast.ImportFrom) and statement.module and statement.module.split(".")[0] == "torchtitan":
                    names += [(statement.module, alias.name) for alias in statement.names]
    return names


def _has(module: str, name: str) -> bool:
    try:
        found = importlib.import_module(module)
    except ImportError:
        return False
    if hasattr(found, name):
        return True
    try:  # ``from package import submodule``
        importlib.import_module(f"{module}.{name}")
    except ImportError:
        return False
    return True


def _missing_fields() -> list[str]:
    missing = []
    for path, names in FIELDS.items():
        module, _, name = path.rpartition(".")
        if not _has(module, name):
            continue  # reported as a missing name
        config = getattr(importlib.import_module(module), name)
        present = {field.name for field in dataclasses.fields(config)}
        missing += [f"{path}.{field}" for field in names if field not in present]
    return missing


def missing_names(source: str | None = None) -> list[str]:
    """The dotted torchtitan names (and ``FIELDS``) this module's imports need that are missing."""
    source = Path(__file__).read_text() if source is None else source
    missing = [f"{module}.{name}" for module, name in imported_names(source) if not _has(module, name)]
    return missing + _missing_fields()


def check_torchtitan(cause: ImportError | None = None) -> None:
    """Raise TorchtitanMismatch when anything this module imports is missing (``cause``: the
    import that failed, named in the message as it may be a dependency of torchtitan's)."""
    missing = missing_names()
    if missing:
        raise TorchtitanMismatch(missing, torchtitan_version(), cause) from cause


try:
    from torchtitan.components.checkpoint import MODEL, AsyncMode, CheckpointManager
    from torchtitan.components.loss import BaseLoss, ChunkedLossWrapper, CrossEntropyLoss
    from torchtitan.components.metrics import BaseLogger, LoggerContainer, MetricsProcessor, _get_metrics_rank
    from torchtitan.components.optimizer import (
        LRSchedulersContainer,
        OptimizersContainer,
        ParamGroupConfig,
        register_moe_load_balancing_hook,
    )
    from torchtitan.components.validate import Validator
    from torchtitan.config import TORCH_DTYPE_MAP, CompileConfig, ParallelismConfig, TrainingConfig
    from torchtitan.config.configs import DebugConfig
    from torchtitan.distributed import utils as dist_utils
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC
    from torchtitan.distributed.pipeline_parallel import (
        _generate_llm_fqn_per_model_part,
        _get_pipeline_metadata,
        _get_pp_rank_to_stage_indices_mapping,
    )
    from torchtitan.experiments.transformers_modeling_backend import HFTransformerModel, TitanModelConfig, TitanMoeModelConfig
    from torchtitan.experiments.transformers_modeling_backend.configs import TransformersBackendConfig
    from torchtitan.experiments.transformers_modeling_backend.parallelize import parallelize_hf_transformers
    from torchtitan.experiments.transformers_modeling_backend.pipeline import pipeline_hf_transformers
    from torchtitan.experiments.transformers_modeling_backend.state_dict_adapter import HFTransformerStateDictAdapter
    from torchtitan.experiments.transformers_modeling_backend.trainer import HFTransformerTrainer
    from torchtitan.hf_datasets import DatasetConfig
    from torchtitan.hf_datasets.text_datasets import DATASETS, HuggingFaceTextDataLoader
    from torchtitan.models.common import CosSinRoPE
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.common.config_utils import get_attention_config
    from torchtitan.models.common.moe import GroupedExperts, MoE
    from torchtitan.models.qwen3 import (
        _EMBEDDING_INIT,
        _EMBEDDING_SKIP_INIT,
        _LINEAR_INIT,
        _NORM_INIT,
        Qwen3Model,
        _build_qwen3_layers,
        _build_qwen3_moe_layers,
        _qwen3_norm,
        _residual_output_weight_init,
        model_registry,
        qwen3_configs,
    )
    from torchtitan.models.qwen3.state_dict_adapter import Qwen3StateDictAdapter
    from torchtitan.protocols.model import ModelConfigConverter
    from torchtitan.protocols.model_spec import ModelSpec
    from torchtitan.protocols.module import Module
    from torchtitan.tools.logging import logger
    from torchtitan.tools.utils import set_default_dtype
    from torchtitan.trainer import Trainer
except ImportError as exc:
    check_torchtitan(cause=exc)
    raise
check_torchtitan()  # the fields, once every name imported
