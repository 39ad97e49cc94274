"""torchtitan's transformers_modeling_backend set up for a Qwen3 architecture (backend=hf_v5): its
model config, ModelSpec and trainer.

Importing this module imports transformers (about 0.8 s of CPU a process): backend=hf_v5 imports
it when it builds a model or a trainer, or checks a kernel choice, so that runs of the other modes
do not pay for it (``qwen3_trn.titan.TRANSFORMERS_BACKEND``).
"""

from __future__ import annotations

from typing import Any, Callable, get_args

from qwen3_trn.hf.model import parallelize_keeping_tied_embeddings
from qwen3_trn.hf.state_dict import Qwen3HFStateDictAdapter
from qwen3_trn.hf.trainer import Qwen3HFTrainer
from qwen3_trn.models.architecture import Qwen3Architecture
from qwen3_trn.titan import (
    HFTransformerModel,
    ModelSpec,
    TitanModelConfig,
    TitanMoeModelConfig,
    parallelize_hf_transformers,
    pipeline_hf_transformers,
    register_moe_load_balancing_hook,
)


def experts_implementations() -> tuple[str, ...]:
    """The values torchtitan's TitanMoeModelConfig.experts_implementation accepts."""
    return tuple(get_args(TitanMoeModelConfig.__dataclass_fields__["experts_implementation"].type)) or (
        "grouped_mm",
        "batched_mm",
        "eager",
        "native",
    )


def titan_hf_model_config(arch: Qwen3Architecture, experts_implementation: str | None = None) -> HFTransformerModel.Config:
    """torchtitan's ``HFTransformerModel.Config`` for the architecture: every size comes from
    the HF config.json (no flavor overrides), only the MoE kernel choice is set here."""
    if arch.is_moe:
        titan = TitanMoeModelConfig()
        if experts_implementation:
            titan.experts_implementation = experts_implementation
    else:
        titan = TitanModelConfig()
    return HFTransformerModel.Config(model_config=titan)


def hf_model_spec(
    arch: Qwen3Architecture, experts_implementation: str | None, flavor: str, adapt: Callable[[Any, Callable], Callable]
) -> ModelSpec:
    """The ModelSpec; ``adapt(model_config, parallelize_fn)`` returns the device's parallelize_fn."""
    config = titan_hf_model_config(arch, experts_implementation)
    return ModelSpec(
        name="transformers_modeling_backend",
        flavor=flavor,
        model=config,
        parallelize_fn=adapt(config, parallelize_keeping_tied_embeddings(parallelize_hf_transformers)),
        pipelining_fn=pipeline_hf_transformers,
        post_optimizer_build_fn=register_moe_load_balancing_hook,
        state_dict_adapter=Qwen3HFStateDictAdapter,
    )


def trainer_config_class() -> type[Qwen3HFTrainer.Config]:
    return Qwen3HFTrainer.Config


__all__ = ["experts_implementations", "hf_model_spec", "titan_hf_model_config", "trainer_config_class"]
