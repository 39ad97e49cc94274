"""Every torchtitan name the project uses, imported here only, and the one adapter to the
torchtitan installed (upstream 0.3.0, or main of the pre-0.3 window; docs/hardware.md, "Which
torchtitan").

Names every supported torchtitan has are required: a missing one raises ``TorchtitanMismatch``
(exit 2). Names added within the window are ``Feature``s, detected by presence, not version:
without one an adapter takes the older path with the same training, or the feature is off
(``MAY_BE_OFF``). Each adapter names the upstream change it bridges.
"""

# ruff: noqa: F401 - the names are imported here for the rest of the package

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib
import importlib.metadata
import importlib.util
import inspect
import json
from pathlib import Path
from typing import Any, Callable

import torch

from qwen3_trn.common.errors import ConfigError, NotApplicable, first_line

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
            "(it runs on upstream torchtitan 0.3.0 and on upstream main from 2026-04-17 on, which AWS's "
            "torchtitan-neuron 0.2.2+neuron.1 is cut from; PyPI's torchtitan 0.2.2 is the older TOML system). "
            "Install upstream torchtitan==0.3.0, or on trn2 AWS's torchtitan-neuron (its `pip install -e .` "
            "provides torchtitan)" + first_error + ".",
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


def _distribution_package_dir(name: str) -> Path | None:
    """Where distribution ``name`` keeps ``torchtitan``: its editable checkout (as AWS installs
    torchtitan-neuron) or site-packages."""
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return None
    direct_url = dist.read_text("direct_url.json")
    if direct_url:
        info = json.loads(direct_url)
        if info.get("dir_info", {}).get("editable") and info.get("url", "").startswith("file://"):
            return Path(info["url"][len("file://") :]) / "torchtitan"
    return Path(str(dist.locate_file("torchtitan")))


@functools.cache
def torchtitan_version() -> str:
    """The imported torchtitan's version (``X (torchtitan-neuron)`` where that distribution
    provides it), or its folder when no installed distribution does."""
    spec = importlib.util.find_spec("torchtitan")
    if spec is None or spec.origin is None:
        return "(not installed)"
    imported = Path(spec.origin).resolve().parent
    for name in ("torchtitan-neuron", "torchtitan"):
        folder = _distribution_package_dir(name)
        if folder is not None and folder.resolve() == imported:
            version = _distribution_version(name)
            return f"{version} (torchtitan-neuron)" if name == "torchtitan-neuron" else str(version)
    return f"from {imported.parent} (no installed distribution)"


def imported_names(source: str) -> list[tuple[str, str]]:
    """(module, name) of each torchtitan import in ``source``'s top-level ``try``."""
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


def missing_names(source: str | None = None) -> list[str]:
    """The dotted names this module's required imports lack."""
    source = Path(__file__).read_text() if source is None else source
    return [f"{module}.{name}" for module, name in imported_names(source) if not _has(module, name)]


def check_torchtitan(cause: ImportError | None = None) -> None:
    """Raise ``TorchtitanMismatch`` when a required name is missing. ``cause``, the failed import,
    is named in the message: it may be one of torchtitan's own dependencies."""
    if isinstance(cause, ModuleNotFoundError) and cause.name and cause.name.split(".")[0] not in ("torchtitan", "qwen3_trn"):
        raise ConfigError(
            "torchtitan",
            f"torchtitan {torchtitan_version()} does not import: it needs the module '{cause.name}', which is not installed. "
            "Install torchtitan's own requirements (AWS's torchtitan-neuron: `pip install -r requirements.txt` in its checkout).",
        ) from cause
    missing = missing_names()
    if missing:
        raise TorchtitanMismatch(missing, torchtitan_version(), cause) from cause


try:
    from torchtitan.components.checkpoint import MODEL, AsyncMode, CheckpointManager
    from torchtitan.components.metrics import BaseLogger, LoggerContainer, MetricsProcessor, _get_metrics_rank
    from torchtitan.components.optimizer import OptimizersContainer, ParamGroupConfig, register_moe_load_balancing_hook
    from torchtitan.components.validate import Validator
    from torchtitan.config import TORCH_DTYPE_MAP, CompileConfig, ParallelismConfig, TrainingConfig
    from torchtitan.config.configs import DebugConfig
    from torchtitan.distributed import utils as dist_utils
    from torchtitan.hf_datasets import DatasetConfig
    from torchtitan.hf_datasets.text_datasets import DATASETS, HuggingFaceTextDataLoader
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.common.config_utils import get_attention_config
    from torchtitan.models.common.moe import GroupedExperts, MoE, TokenChoiceTopKRouter
    from torchtitan.models.qwen3 import (
        _EMBEDDING_INIT,
        _EMBEDDING_SKIP_INIT,
        _LINEAR_INIT,
        _NORM_INIT,
        Qwen3Model,
        _build_qwen3_layers,
        _build_qwen3_moe_layers,
        _qwen3_norm,
        model_registry,
        qwen3_configs,
    )
    from torchtitan.models.qwen3.state_dict_adapter import Qwen3StateDictAdapter
    from torchtitan.protocols.model_spec import ModelSpec
    from torchtitan.protocols.module import Module
    from torchtitan.tools.logging import logger
    from torchtitan.tools.utils import set_default_dtype
    from torchtitan.trainer import Trainer
except ImportError as exc:
    check_torchtitan(cause=exc)
    raise


@dataclasses.dataclass(frozen=True)
class Feature:
    """Names upstream torchtitan added within the supported range, looked up together."""

    name: str
    added: str
    """When upstream added them: the version window they are missing from."""
    without: str
    """What a run does where they are missing (one clause, for ``mode=plan``)."""
    names: dict[str, object]
    missing: tuple[str, ...]
    error: str | None = None
    """Why importing them failed, where a module of theirs does not import at all."""
    key: str = "torchtitan"
    """The config key a command that needs the feature is refused on."""

    @property
    def available(self) -> bool:
        return not self.missing and self.error is None

    def __getitem__(self, name: str) -> Any:
        """The name, or where it is missing a stand-in that can be subclassed and raises
        ``refusal()`` when built or called."""
        if name in self.names:
            return self.names[name]
        feature = self

        def refuse(*args: Any, **kwargs: Any) -> None:
            raise feature.refusal()

        return type(name, (), {"__init__": refuse, "__doc__": f"torchtitan's {name}, missing here: {self.name} is off."})

    def lacking(self) -> str:
        """The missing names, and a module that fails to import."""
        parts = [", ".join(self.missing)] if self.missing else []
        if self.error:
            parts.append(f"a working import ({self.error})")
        return " and ".join(parts)

    def describe(self) -> str:
        """One line for ``mode=plan``."""
        return f"{self.name}: this torchtitan lacks {self.lacking()} (upstream added it {self.added}); {self.without}."

    def refusal(self) -> ConfigError:
        """The error of a command that needs the feature (``NotApplicable``: a sweep skips it)."""
        return NotApplicable(
            self.key,
            f"{self.name} cannot run on torchtitan {torchtitan_version()}: it lacks {self.lacking()} "
            f"(upstream added it {self.added}); {self.without}.",
        )


def _has_module_file(module: str) -> bool:
    """Whether torchtitan's source has ``module``, without importing it."""
    spec = importlib.util.find_spec("torchtitan")
    path = Path(spec.origin).parent.joinpath(*module.split(".")[1:])
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _feature(name: str, added: str, without: str, *imports: tuple[str, str], key: str = "torchtitan") -> Feature:
    names, missing, error = {}, [], None
    for module, attr in imports:
        try:
            found = importlib.import_module(module)
        except ImportError:
            missing.append(f"{module}.{attr}")
            continue
        except Exception as exc:  # a module of that torchtitan fails at import (e.g. with a newer transformers)
            error = error or f"importing {module} raises {type(exc).__name__}: {first_line(exc)}"
            if not _has_module_file(module):
                missing.append(f"{module}.{attr}")
            continue
        if hasattr(found, attr):
            names[attr] = getattr(found, attr)
        else:
            missing.append(f"{module}.{attr}")
    return Feature(name, added, without, names, tuple(missing), error, key)


def _has_field(config: type, field: str) -> bool:
    return field in {f.name for f in dataclasses.fields(config)}


def _field_feature(name: str, added: str, without: str, config: type, field: str) -> Feature:
    return Feature(name, added, without, {}, () if _has_field(config, field) else (f"{config.__module__}.{config.__qualname__}.{field}",))


def _attention_layer_config() -> type:
    return type(qwen3_configs["debugmodel"](attn_backend="flex").layers[0].attention)


# The names upstream added after 7cec16600 (2026-04-17), each with the date it was added.
CHUNKED_LOSS = _feature(
    "chunked loss",
    "2026-06-26",
    "the cross-entropy loss is computed on the whole output at once",
    ("torchtitan.components.loss", "ChunkedLossWrapper"),
)
LOSS_CONFIGS = _feature(
    "loss configs",
    "2026-04-27",
    "the model spec's cross-entropy (ModelSpec.build_loss_fn) is used",
    ("torchtitan.components.loss", "BaseLoss"),
    ("torchtitan.components.loss", "CrossEntropyLoss"),
)
AC_CONFIGS = _feature(
    "activation checkpointing classes",
    "2026-06-15",
    "ActivationCheckpointConfig(mode=...) is set instead",
    ("torchtitan.distributed.activation_checkpoint", "FullAC"),
    ("torchtitan.distributed.activation_checkpoint", "SelectiveAC"),
)
LAYER_ROPE = _feature(
    "per-layer rope",
    "2026-06-05",
    "the model-level rope config is set instead",
    ("torchtitan.models.common", "CosSinRoPE"),
)
_LAYER_MASK_TYPE = _field_feature("", "", "", _attention_layer_config(), "mask_type")
# the activation checkpointing config before AC_CONFIGS
_AC_MODE_CONFIG = _feature(
    "", "", "", ("torchtitan.config.configs", "ActivationCheckpointConfig"), ("torchtitan.distributed.activation_checkpoint", "apply_ac")
)
# the loss before LOSS_CONFIGS
_CROSS_ENTROPY_FN = _feature("", "", "", ("torchtitan.components.loss", "cross_entropy_loss"))
CONFIG_CONVERTERS = _feature(
    "model config converters",
    "2026-05-08",
    "the project's converters are applied to the model config directly",
    ("torchtitan.protocols.model", "ModelConfigConverter"),
)
PIPELINE_STAGES = _feature(
    "pipeline-parallel planning",
    "2026-05-04",
    "parallelism.pp > 1 is refused",
    ("torchtitan.distributed.pipeline_parallel", "_generate_llm_fqn_per_model_part"),
    ("torchtitan.distributed.pipeline_parallel", "_get_pipeline_metadata"),
    ("torchtitan.distributed.pipeline_parallel", "_get_pp_rank_to_stage_indices_mapping"),
    key="parallelism.pp",
)
CUDA_GRAPHS_FLAG = _field_feature(
    "TrainingConfig.disable_cuda_graphs",
    "2026-08-13",
    "torchtitan replays no CUDA graphs and frees gradients as before",
    TrainingConfig,
    "disable_cuda_graphs",
)


class DeferredFeature:
    """A ``Feature`` whose modules are imported when it is first asked about, for one that only
    some runs use and whose import is heavy."""

    def __init__(self, load: Callable[[], Feature]) -> None:
        self._load = functools.cache(load)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._load(), name)

    def __getitem__(self, name: str) -> Any:
        return self._load()[name]


# Imports transformers (about 0.8 s of CPU a process): only backend=hf_v5 builds with it.
TRANSFORMERS_BACKEND = DeferredFeature(
    lambda: _feature(
        "backend=hf_v5",
        "from 2026-06-29 to 2026-08-12",
        "use backend=native (the same Qwen3 in torchtitan's own modeling) or upstream torchtitan 0.3.0",
        ("torchtitan.experiments.transformers_modeling_backend", "HFTransformerModel"),
        ("torchtitan.experiments.transformers_modeling_backend", "TitanModelConfig"),
        ("torchtitan.experiments.transformers_modeling_backend", "TitanMoeModelConfig"),
        ("torchtitan.experiments.transformers_modeling_backend.configs", "TransformersBackendConfig"),
        ("torchtitan.experiments.transformers_modeling_backend.parallelize", "parallelize_hf_transformers"),
        ("torchtitan.experiments.transformers_modeling_backend.pipeline", "pipeline_hf_transformers"),
        ("torchtitan.experiments.transformers_modeling_backend.state_dict_adapter", "HFTransformerStateDictAdapter"),
        ("torchtitan.experiments.transformers_modeling_backend.trainer", "HFTransformerTrainer"),
        ("torchtitan.models.qwen3", "_residual_output_weight_init"),
        key="backend",
    )
)

# TRANSFORMERS_BACKEND's names, resolved when a module imports them (``qwen3_trn.hf``).
_TRANSFORMERS_BACKEND_NAMES = frozenset(
    {
        "HFTransformerModel",
        "TitanModelConfig",
        "TitanMoeModelConfig",
        "TransformersBackendConfig",
        "parallelize_hf_transformers",
        "pipeline_hf_transformers",
        "HFTransformerStateDictAdapter",
        "HFTransformerTrainer",
        "_residual_output_weight_init",
    }
)


def __getattr__(name: str) -> Any:
    if name in _TRANSFORMERS_BACKEND_NAMES:
        return TRANSFORMERS_BACKEND[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# torchtitan 0.3 moved the LR scheduler into components.optimizer (2026-08-17).
try:
    from torchtitan.components.optimizer import LRSchedulersContainer
except ImportError:
    from torchtitan.components.lr_scheduler import LRSchedulersContainer

ChunkedLossWrapper = CHUNKED_LOSS["ChunkedLossWrapper"]
BaseLoss, CrossEntropyLoss = LOSS_CONFIGS["BaseLoss"], LOSS_CONFIGS["CrossEntropyLoss"]
CosSinRoPE = LAYER_ROPE["CosSinRoPE"]
_generate_llm_fqn_per_model_part = PIPELINE_STAGES["_generate_llm_fqn_per_model_part"]
_get_pipeline_metadata = PIPELINE_STAGES["_get_pipeline_metadata"]
_get_pp_rank_to_stage_indices_mapping = PIPELINE_STAGES["_get_pp_rank_to_stage_indices_mapping"]


if CONFIG_CONVERTERS.available:
    ModelConfigConverter = CONFIG_CONVERTERS["ModelConfigConverter"]
else:
    from torchtitan.config import Configurable

    class ModelConfigConverter(Configurable):
        """torchtitan 0.3's ``ModelConfigConverter`` for a torchtitan that predates it; the project then
        applies its converters itself (``models.qwen3.native_model_spec``)."""

        @dataclasses.dataclass(kw_only=True, slots=True)
        class Config(Configurable.Config):
            pass

        def convert(self, model_config: Module.Config) -> Module.Config:
            raise NotImplementedError


def nested_configs(root: Any, config_cls: type, prefix: str = "") -> Any:
    """``(fqn, config, parent, attr)`` of every ``config_cls`` in a config tree:
    ``Configurable.Config.traverse`` (2026-04-27 on), or the same walk before it."""
    if hasattr(root, "traverse"):
        yield from root.traverse(config_cls)
        return
    for field in dataclasses.fields(root):
        value, fqn = getattr(root, field.name), f"{prefix}{field.name}"
        items = list(enumerate(value)) if isinstance(value, list) else [(None, value)]
        for index, item in items:
            item_fqn = fqn if index is None else f"{fqn}.{index}"
            if isinstance(item, config_cls):
                yield item_fqn, item, (root if index is None else value), (field.name if index is None else index)
            elif dataclasses.is_dataclass(item) and not isinstance(item, type):
                yield from nested_configs(item, config_cls, f"{item_fqn}.")


def expert_weights(experts: GroupedExperts) -> tuple[Any, Any, Any]:
    """The experts' ``w1``, ``w2``, ``w3`` ([E, F, D], [E, D, F], [E, F, D]; named ``w1_EFD``...
    from 2026-05-27)."""
    if hasattr(experts, "w1_EFD"):
        return experts.w1_EFD, experts.w2_EDF, experts.w3_EFD
    return experts.w1, experts.w2, experts.w3


# "standard" token dispatch: local without expert parallelism, all-to-all with it (0.3 and main
# from 2026-04-28). Before, the MoE layer builder's default (None) built local dispatchers only and
# "standard" always built all-to-all ones, so expert parallelism is off there.
_DISPATCH_CHOSEN_AT_PARALLELIZE = (
    inspect.signature(_build_qwen3_moe_layers).parameters["moe_comm_backend"].default is inspect.Parameter.empty
)
EXPERT_PARALLEL = Feature(
    "expert parallelism",
    "2026-04-28",
    "parallelism.ep > 1 is refused (experts are not sharded over ranks)",
    {},
    () if _DISPATCH_CHOSEN_AT_PARALLELIZE else ("a MoE layer builder that chooses the token dispatcher when parallelizing",),
    key="parallelism.ep",
)


# What a run can lose on an older torchtitan; the other features above have an older path that
# trains the same way.
MAY_BE_OFF = (CHUNKED_LOSS, PIPELINE_STAGES, EXPERT_PARALLEL, TRANSFORMERS_BACKEND)


def features_off() -> list[Feature]:
    return [feature for feature in MAY_BE_OFF if not feature.available]


def moe_dispatch_args() -> dict[str, str]:
    """The token-dispatch keyword of ``_build_qwen3_moe_layers`` (see ``EXPERT_PARALLEL``)."""
    return {"moe_comm_backend": "standard"} if _DISPATCH_CHOSEN_AT_PARALLELIZE else {}


def _histc_of_integers(histc: Any) -> Any:
    """``torch.histc`` that also counts integer tensors on the CPU, as CUDA does."""

    @functools.wraps(histc)
    def counting(input: Any, *args: Any, **kwargs: Any) -> Any:
        if input.is_floating_point() or input.device.type != "cpu":
            return histc(input, *args, **kwargs)
        return histc(input.float(), *args, **kwargs).to(input.dtype)

    return counting


# torchtitan main before 2026-06-01 counts each expert's routed tokens with ``torch.histc`` over
# the integer expert ids (``TokenChoiceTopKRouter.forward``), which CUDA counts and the CPU kernel
# refuses ("histogram_cpu" not implemented for 'Long'); the CPU runs that router in CPU training
# and in the fit probe of every device. Counted in float32 the counts are exact up to 2**24 per
# expert; other inputs go to torch's own histc.
if "torch.histc(" in inspect.getsource(TokenChoiceTopKRouter.forward) and not hasattr(torch.histc, "__wrapped__"):
    torch.histc = _histc_of_integers(torch.histc)


# One checkpoint save: 0.3's ``CheckpointManager.save`` checks ``enable`` and calls ``_save``,
# which subclasses override; before, ``save`` itself was the whole save.
CHECKPOINT_SAVE = "_save" if hasattr(CheckpointManager, "_save") else "save"


def checkpoint_save(manager: CheckpointManager, curr_step: int, last_step: bool) -> bool:
    """torchtitan's own save of ``manager`` (for subclasses that wrap it)."""
    return bool(getattr(CheckpointManager, CHECKPOINT_SAVE)(manager, curr_step, last_step))


def replaces_checkpoint_save(cls: type) -> type:
    """Class decorator: a ``CheckpointManager`` subclass's ``_save(curr_step, last_step)`` is what
    this torchtitan's trainer calls to save (before 0.3 through ``save``, checking ``enable`` first)."""
    if CHECKPOINT_SAVE == "save":

        def save(self: Any, curr_step: int, last_step: bool = False) -> bool:
            return cls._save(self, curr_step, last_step) if self.enable else False

        cls.save = save
    return cls


# The expert MLP's math alone, on routed rows: ``GroupedExperts.forward`` in 0.3; before, forward
# also dispatched and combined the tokens and called ``_experts_forward`` for the math.
EXPERT_MATH = "_experts_forward" if hasattr(GroupedExperts, "_experts_forward") else "forward"


def grouped_experts_math(experts: GroupedExperts, x_RD: Any, num_tokens_per_expert_E: Any) -> Any:
    """``GroupedExperts``' own expert math (for subclasses that prepare its inputs)."""
    return getattr(GroupedExperts, EXPERT_MATH)(experts, x_RD, num_tokens_per_expert_E)


def replaces_expert_math(cls: type) -> type:
    """Class decorator: a ``GroupedExperts`` subclass's ``expert_math(x_RD,
    num_tokens_per_expert_E)`` becomes the method this torchtitan calls for the math."""
    setattr(cls, EXPERT_MATH, cls.expert_math)
    return cls


def attention_config(name: str) -> Module.Config:
    """The inner attention config of ``name`` (before 0.3 ``get_attention_config`` returned it with
    its mask type, which ``attention_mask_type`` gives)."""
    if name == "sdpa":
        return ScaledDotProductAttention.Config()
    found = get_attention_config(name)
    return found[0] if isinstance(found, tuple) else found


def attention_mask_type(inner_attention: Module.Config) -> str | None:
    """The ``mask_type`` attention layers held beside their inner attention before 0.3 (0.3 reads
    it from the inner attention: None)."""
    if not _LAYER_MASK_TYPE.available:
        return None
    return "causal" if isinstance(inner_attention, ScaledDotProductAttention.Config) else "block_causal"


def loss_config(vocab_size: int) -> object | None:
    """``Trainer.Config.loss``: chunked cross-entropy (0.3.0), plain cross-entropy (before
    2026-06-26), or None where the model spec's ``build_loss_fn`` is the loss (before 2026-04-27)."""
    if not LOSS_CONFIGS.available:
        return None
    # global_vocab_size (0.3): the unpadded vocabulary of tensor-parallel loss
    loss = CrossEntropyLoss.Config(
        **({"global_vocab_size": vocab_size} if _has_field(CrossEntropyLoss.Config, "global_vocab_size") else {})
    )
    return ChunkedLossWrapper.Config(loss_fn=loss) if CHUNKED_LOSS.available else loss


def build_loss(loss_config: object | None) -> Any:
    """A ``Trainer.Config.loss`` built, called as ``(pred, labels, global_valid_tokens)`` (see
    ``loss_value``); ``None`` (a Trainer.Config without ``loss``, before 2026-04-27): torchtitan's
    cross-entropy of that time, which the model spec's ``build_loss_fn`` returns."""
    if loss_config is not None:
        return loss_config.build()
    cross_entropy = _CROSS_ENTROPY_FN["cross_entropy_loss"]
    return lambda pred, labels, global_valid_tokens: cross_entropy(pred, labels) / global_valid_tokens


def loss_value(output: Any) -> Any:
    """The loss of what a built loss returns: 0.3's losses return ``(loss, extras)``, earlier ones the loss."""
    return output[0] if isinstance(output, tuple) else output


def apply_activation_checkpointing(model: Any, ac_config: object) -> None:
    """``Trainer.Config.activation_checkpoint`` applied to ``model`` (0.3: the config builds its
    policy; before 2026-06-15 torchtitan's ``apply_ac(model, config)``)."""
    if hasattr(ac_config, "build"):
        ac_config.build(dump_folder="").apply(model)
    else:
        _AC_MODE_CONFIG["apply_ac"](model, ac_config)


def activation_checkpoint_config(mode: str) -> object | None:
    """``Trainer.Config.activation_checkpoint`` for ``none``/``selective``/``full``."""
    if AC_CONFIGS.available:
        return None if mode == "none" else AC_CONFIGS["SelectiveAC" if mode == "selective" else "FullAC"].Config()
    # Before 2026-06-15 one dataclass held the mode; its default is "selective", not off.
    return _AC_MODE_CONFIG["ActivationCheckpointConfig"](mode=mode)


def optimizer_config(name: str, lr: float, betas: tuple[float, float], eps: float, weight_decay: float) -> OptimizersContainer.Config:
    """One AdamW/Adam for every parameter. 0.3 names the optimizer and its arguments per parameter
    group (2026-06-04); before, ``OptimizersContainer.Config`` held them."""
    kwargs = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay}
    if _has_field(ParamGroupConfig, "optimizer_kwargs"):
        return OptimizersContainer.Config(param_groups=[ParamGroupConfig(pattern=r".*", optimizer_name=name, optimizer_kwargs=kwargs)])
    return OptimizersContainer.Config(
        name=name, lr=lr, beta1=betas[0], beta2=betas[1], eps=eps, weight_decay=weight_decay, implementation="foreach"
    )


def training_config(**fields: object) -> TrainingConfig:
    """``TrainingConfig`` of the fields this torchtitan has (``disable_cuda_graphs``: 2026-08-13)."""
    if not CUDA_GRAPHS_FLAG.available:
        fields.pop("disable_cuda_graphs")
    return TrainingConfig(**fields)


def grads_set_to_none(training: TrainingConfig) -> bool:
    """Whether the optimizer frees gradients between steps: 0.3 keeps them for CUDA-graph replay
    unless ``disable_cuda_graphs``; before that flag, torchtitan always freed them."""
    return getattr(training, "disable_cuda_graphs", True)
