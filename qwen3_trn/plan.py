"""``mode=plan``: what a run would do, without starting it."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from qwen3_trn.outputs import CONFIG_FILE
from qwen3_trn.preflight import Prepared


def torchrun_command(prepared: Prepared, config_path: Path) -> str:
    """The torchrun line that starts the same ranks (the seed article's launch pattern)."""
    launcher = prepared.cfg.launcher
    layout = prepared.layout
    endpoint = launcher.rdzv_endpoint or ("localhost:0" if layout.nnodes == 1 else "<head-node>:29500")
    parts = [
        "torchrun",
        f"--nnodes={layout.nnodes}",
        f"--nproc_per_node={layout.nproc_per_node}",
        f"--rdzv_backend={launcher.rdzv_backend}",
        f"--rdzv_endpoint={endpoint}",
        *([f"--rdzv_id={launcher.rdzv_id}"] if launcher.rdzv_id else []),
        "--local-ranks-filter=0",
        "--role=rank",
        "--tee=3",
        "-m",
        "qwen3_trn.rank",
        str(config_path),
    ]
    env = " ".join(f"{key}={shlex.quote(str(value))}" for key, value in launcher.env.items())
    return (env + " " if env else "") + " ".join(parts)


def device_mapping(prepared: Prepared) -> list[str]:
    layout, device = prepared.layout, prepared.device
    where = {
        "neuron": "NeuronCore LOCAL_RANK (NEURON_RT_VISIBLE_CORES)",
        "cuda": "cuda:LOCAL_RANK",
        "cpu": "CPU threads shared by the node's ranks",
    }[device.type]
    lines = []
    for node in range(layout.nnodes):
        first = node * layout.nproc_per_node
        lines.append(f"node {node}: ranks {first}-{first + layout.nproc_per_node - 1} -> {where}")
    return lines


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(_flatten(value, f"{prefix}{key}."))
        return out  # an empty mapping has no leaves (its keys show up when they are set)
    return {prefix.rstrip("."): node}


def config_differences(resolved: DictConfig) -> tuple[list[str], str, list[str]]:
    """The job's overrides, what it is compared with, and the resolved keys that differ from it:
    in a sweep the config without the swept overrides, else the defaults (conf/config.yaml)."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return [], "", []
    from qwen3_trn.sweep import job_context, override_key

    hydra_cfg = HydraConfig.get()
    overrides = list(hydra_cfg.overrides.task)
    sweep = job_context()
    if sweep is not None:
        swept = set(sweep.get("swept_keys") or [])
        base_overrides = [o for o in overrides if override_key(o) not in swept]
        base_name = f"the sweep's common config (without its swept keys: {', '.join(sorted(swept)) or '-'})"
    else:
        base_overrides, base_name = [], f"the defaults ({hydra_cfg.job.config_name}.yaml without overrides)"
    try:
        from hydra import compose

        base = OmegaConf.to_container(compose(config_name=hydra_cfg.job.config_name, overrides=base_overrides), resolve=True)
        job = OmegaConf.to_container(resolved, resolve=True)
    except Exception as exc:  # noqa: BLE001 - the plan is still useful without the diff
        return overrides, base_name, [f"(could not compose the base config: {type(exc).__name__}: {exc})"]
    before, after = _flatten(base), _flatten(job)
    lines = []
    for key in sorted(set(before) | set(after)):
        if key == "output_dir" or key.startswith("hydra."):
            continue
        if before.get(key, "<absent>") != after.get(key, "<absent>"):
            lines.append(f"{key}: {before.get(key, '<absent>')} -> {after.get(key, '<absent>')}")
    return overrides, base_name, lines


def where_it_runs(prepared: Prepared) -> str:
    if prepared.cfg.launcher.name == "slurm":
        from qwen3_trn.launch.slurm import where

        return where(prepared.cfg, prepared.layout.nnodes)
    return f"this machine (launcher={prepared.cfg.launcher.name})"


_DIFFERENCES: dict[str, list[str]] = {}


def _sbatch_script(prepared: Prepared, run_dir: Path) -> str:
    from qwen3_trn.launch.slurm import SLURM_FOLDER, sbatch_script

    try:
        return sbatch_script(prepared.cfg, prepared.layout.nnodes, Path(run_dir).resolve() / SLURM_FOLDER)
    except ImportError:
        return "sbatch script: see plan.txt (submitit is not installed here)"


def plan_record(prepared: Prepared, run_dir: Path) -> dict[str, Any]:
    """What a sweep's manifest records of a planned job."""
    slurm = prepared.cfg.launcher.name == "slurm"
    return {
        "world_size": prepared.layout.world_size,
        "layout": prepared.layout.describe(),
        "where": where_it_runs(prepared),
        "submission": _sbatch_script(prepared, run_dir) if slurm else torchrun_command(prepared, run_dir / CONFIG_FILE),
        "differences": _DIFFERENCES.get(str(run_dir), []),
        "plan_file": str(run_dir / "plan.txt"),
    }


def render_plan(prepared: Prepared, resolved: DictConfig, run_dir: Path) -> str:
    present = "present" if prepared.device.count else "not on this machine: planned only"
    overrides, base_name, differences = config_differences(resolved)
    _DIFFERENCES[str(run_dir)] = differences
    sections = [
        ("Resolved config", OmegaConf.to_yaml(resolved, resolve=True).rstrip()),
        (
            "Overrides and differences from the base config",
            "\n".join([f"overrides: {' '.join(overrides) or '(none)'}", f"compared with: {base_name}", *(f"  {line}" for line in differences)])
            if base_name else "(not composed by Hydra)",
        ),
        (
            "World",
            "\n".join(
                [f"device: {prepared.device.type} ({present})", prepared.layout.describe(), *device_mapping(prepared),
                 f"where: {where_it_runs(prepared)}"]
            ),
        ),
        ("Architecture", json.dumps(prepared.arch.summary())),
        ("Equivalent torchrun command", torchrun_command(prepared, run_dir / CONFIG_FILE)),
    ]
    if prepared.cfg.launcher.name == "slurm":
        from qwen3_trn.launch.slurm import plan_section

        sections.append(("Slurm submission (not submitted)", plan_section(prepared, run_dir)))
    sections.append(("torchtitan Trainer.Config", json.dumps(prepared.trainer_config.to_dict(), indent=1, default=repr)))
    return "\n\n".join(f"== {title} ==\n{body}" for title, body in sections) + "\n"
