"""``mode=plan``: what a run would do, without starting it."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

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


def render_plan(prepared: Prepared, resolved: DictConfig, run_dir: Path) -> str:
    present = "present" if prepared.device.count else "not on this machine: planned only"
    sections = [
        ("Resolved config", OmegaConf.to_yaml(resolved, resolve=True).rstrip()),
        (
            "World",
            "\n".join(
                [f"device: {prepared.device.type} ({present})", prepared.layout.describe(), *device_mapping(prepared)]
            ),
        ),
        ("Architecture", json.dumps(prepared.arch.summary())),
        ("Equivalent torchrun command", torchrun_command(prepared, run_dir / CONFIG_FILE)),
        ("torchtitan Trainer.Config", json.dumps(prepared.trainer_config.to_dict(), indent=1, default=repr)),
    ]
    return "\n\n".join(f"== {title} ==\n{body}" for title, body in sections) + "\n"
