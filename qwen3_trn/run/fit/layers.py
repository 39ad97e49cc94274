"""What rank 0 holds of the model: all of it, or its pipeline stages, split as torchtitan splits them."""

from __future__ import annotations

from dataclasses import dataclass

from qwen3_trn.config.schema import ModelConfig
from qwen3_trn.run.layout import Layout
from qwen3_trn.titan import ParallelismConfig as TitanParallelismConfig
from qwen3_trn.titan import _generate_llm_fqn_per_model_part, _get_pipeline_metadata, _get_pp_rank_to_stage_indices_mapping


@dataclass(frozen=True)
class _Depth:
    """What ``_get_pipeline_metadata`` reads of a model config: its list of blocks."""

    layers: list


@dataclass(frozen=True)
class _Degrees:
    """What ``_get_pipeline_metadata`` reads of the parallel dims: the pipeline degree."""

    pp: int


def rank0_stages(parallelism: TitanParallelismConfig, pp: int, n_layers: int) -> list[list[str]]:
    """Module names of each pipeline stage rank 0 holds (one list for the whole model without PP)."""
    if pp == 1:
        return [["tok_embeddings", *(f"layers.{i}" for i in range(n_layers)), "norm", "lm_head"]]

    stages, layers, first_weight, last_weight = _get_pipeline_metadata(_Degrees(pp), parallelism, _Depth([None] * n_layers))
    per_stage = _generate_llm_fqn_per_model_part(stages, layers, first_weight, last_weight)
    mine = _get_pp_rank_to_stage_indices_mapping(0, pp, parallelism.pipeline_parallel_schedule, stages)
    return [per_stage[index] for index in mine]


def rank0_layers(model: ModelConfig, layout: Layout, trainer_config, n_layers: int | None = None) -> list[int]:
    """Indices of the transformer blocks on rank 0 (``n_layers`` defaults to the model group's)."""
    depth = n_layers if n_layers is not None else _depth(model, trainer_config)
    names = [name for stage in rank0_stages(trainer_config.parallelism, layout.pp, depth) for name in stage]
    return [int(name.split(".")[1]) for name in names if name.startswith("layers.")]


def _depth(model: ModelConfig, trainer_config) -> int:
    layers = getattr(trainer_config.model_spec.model, "layers", None)
    return len(layers) if layers is not None else int(model.n_layers)
