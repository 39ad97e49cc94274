"""``mode=plan``: what a run would do, without starting it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra import compose
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from qwen3_trn.common.redact import redact_overrides, redact_tree
from qwen3_trn.config.overrides import override_key
from qwen3_trn.launch import LaunchDescription
from qwen3_trn.results.records import CONFIG_FILE, PLAN_FILE, PLAN_TEXT_FILE, TRAINER_CONFIG_FILE
from qwen3_trn.run.layout import Layout
from qwen3_trn.run.preflight import Prepared
from qwen3_trn.titan import features_off, torchtitan_version


def device_mapping(device_type: str, layout: Layout) -> list[str]:
    where = {
        "neuron": "NeuronCore LOCAL_RANK (NEURON_RT_VISIBLE_CORES)",
        "cuda": "cuda:LOCAL_RANK",
        "cpu": "CPU threads shared by the node's ranks",
    }[device_type]
    lines = []
    for node in range(layout.nnodes):
        first = node * layout.nproc_per_node
        lines.append(f"node {node}: ranks {first}-{first + layout.nproc_per_node - 1} -> {where}")
    return lines


def backend_facts(prepared: Prepared) -> list[str]:
    """The training mode and what it records of the run (its kernel, attention, token groups)."""
    backend = prepared.backend
    facts = backend.run_info(prepared.cfg, prepared.arch, prepared.device)
    return [
        f"backend={prepared.cfg.backend.name}: {backend.description}",
        *(f"{key}: {as_written(value)}" for key, value in facts.items()),
        f"torchtitan: {torchtitan_version()}",
        *(f"off here: {feature.describe()}" for feature in features_off()),
    ]


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(_flatten(value, f"{prefix}{key}."))
        return out  # an empty mapping has no leaves (its keys show up when they are set)
    return {prefix.rstrip("."): node}


def as_written(value: Any) -> str:
    """A config value as a user writes it on the command line or in YAML."""
    if isinstance(value, list):
        return "[" + ", ".join(as_written(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {as_written(v)}" for k, v in value.items()) + "}"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def config_differences(resolved: DictConfig, swept_keys: list[str] | None) -> tuple[list[str], str, list[str]]:
    """The job's overrides, its baseline and the resolved keys that differ from it: in a sweep
    (``swept_keys`` given) the config without the swept overrides, else the defaults."""
    if not HydraConfig.initialized():
        return [], "", []
    hydra_cfg = HydraConfig.get()
    overrides = list(hydra_cfg.overrides.task)
    if swept_keys is not None:
        swept = set(swept_keys)
        base_overrides = [o for o in overrides if override_key(o) not in swept]
        base_name = f"the sweep's common config (without its swept keys: {', '.join(sorted(swept)) or '-'})"
    else:
        base_overrides, base_name = [], f"the defaults ({hydra_cfg.job.config_name}.yaml without overrides)"
    try:
        base_cfg = compose(config_name=hydra_cfg.job.config_name, overrides=base_overrides)
        base = redact_tree(OmegaConf.to_container(base_cfg, resolve=True, enum_to_str=True))
        job = redact_tree(OmegaConf.to_container(resolved, resolve=True, enum_to_str=True))
    except Exception as exc:  # noqa: BLE001 - the plan is still useful without the diff
        return redact_overrides(overrides), base_name, [f"(could not compose the base config: {type(exc).__name__}: {exc})"]
    before, after = _flatten(base), _flatten(job)
    lines = []
    for key in sorted(set(before) | set(after)):
        if key == "output_dir" or key.startswith("hydra."):
            continue
        if before.get(key, "<absent>") != after.get(key, "<absent>"):
            lines.append(f"{key}: {as_written(before.get(key, '<absent>'))} -> {as_written(after.get(key, '<absent>'))}")
    return redact_overrides(overrides), base_name, lines


def plan_record(prepared: Prepared, launch: LaunchDescription, run_dir: Path, differences: list[str]) -> dict[str, Any]:
    """What a sweep's manifest and the run's summary record of a planned job."""
    return {
        "world_size": prepared.layout.world_size,
        "layout": prepared.layout.describe(),
        "where": launch.where,
        "submission": launch.submission,
        "differences": differences,
        "plan_file": str(run_dir / PLAN_TEXT_FILE),
        **({"fit": prepared.fit.to_record()} if prepared.fit is not None else {}),
    }


def render_plan(prepared: Prepared, launch: LaunchDescription, differences: tuple[list[str], str, list[str]], run_dir: Path | None) -> str:
    """A plan in a screen or so: differences from the defaults, world and layout, memory per rank,
    the torchrun line, and the paths of the full configs (none for a planned sweep's job)."""
    present = "present" if prepared.device.count else "not on this machine: planned only"
    overrides, base_name, lines = differences
    sections = [
        (
            "Overrides and differences from the base config",
            "\n".join([f"overrides: {' '.join(overrides) or '(none)'}", f"compared with: {base_name}", *(f"  {line}" for line in lines)])
            if base_name
            else "(not composed by Hydra)",
        ),
        (
            "World",
            "\n".join(
                [
                    f"device: {prepared.device.type} ({present})",
                    prepared.layout.describe(),
                    *device_mapping(prepared.device.type, prepared.layout),
                    f"where: {launch.where}",
                ]
            ),
        ),
        ("Backend", "\n".join(backend_facts(prepared))),
        ("Architecture", ", ".join(f"{key}={as_written(value)}" for key, value in prepared.arch.summary().items())),
        *([("Memory and compute per rank (will it fit?)", prepared.fit.table())] if prepared.fit is not None else []),
        ("Equivalent torchrun command", launch.torchrun),
        *launch.sections.items(),
    ]
    if run_dir is not None:
        files = [
            f"resolved config: {run_dir / CONFIG_FILE}",
            f"torchtitan Trainer.Config: {run_dir / TRAINER_CONFIG_FILE}",
            f"this plan: {run_dir / PLAN_TEXT_FILE} ({PLAN_FILE} for programs)",
        ]
        sections.append(("Files", "\n".join(files)))
    return "\n\n".join(f"== {title} ==\n{body}" for title, body in sections) + "\n"
