"""Submitting a run to Slurm: the checks before it, the sbatch parameters and script.

Everything here runs on the submitting machine and needs no job: ``check_config`` (keys only,
also for ``mode=plan``), ``check_cluster`` (Slurm reachable, the partition known), and the
sbatch script submitit writes (rendered without submitting for ``mode=plan``).
"""

from __future__ import annotations

import math
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from qwen3_trn.common.errors import ConfigError
from qwen3_trn.common.redact import is_redacted, looks_secret
from qwen3_trn.config.schema import RunConfig

COMMANDS = ("sbatch", "sinfo", "srun", "sacct", "squeue")
DEFAULT_SLURM_CONF = "/etc/slurm/slurm.conf"


def time_minutes(value: Any) -> int:
    """Minutes of a Slurm time limit: ``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``, ``D-HH:MM:SS``."""
    text = str(value).strip()
    match = re.fullmatch(r"(?:(\d+)-)?(\d+(?::\d+){0,2})", text)
    if not match:
        raise ConfigError(
            "launcher.time", f"'{text}' is not a Slurm time limit; use minutes (60), HH:MM:SS (4:00:00) or D-HH:MM:SS (1-12:00:00)."
        )
    days, rest = match.group(1), [int(p) for p in match.group(2).split(":")]
    if days is not None:
        hours, minutes, seconds = (rest + [0, 0])[:3]
        total = int(days) * 86400 + hours * 3600 + minutes * 60 + seconds
    elif len(rest) == 3:
        total = rest[0] * 3600 + rest[1] * 60 + rest[2]
    elif len(rest) == 2:
        total = rest[0] * 60 + rest[1]
    else:
        total = rest[0] * 60
    if total < 60:
        raise ConfigError(
            "launcher.time",
            f"'{text}' is under one minute; give the job at least 1 minute (10 or more to be requeued on preemption, see docs/slurm.md).",
        )
    return math.ceil(total / 60)


def check_config(cfg: RunConfig) -> None:
    """Checks of the launcher=slurm keys that need no cluster (also in mode=plan)."""
    launcher = cfg.launcher
    time_minutes(launcher.time)  # numeric keys: qwen3_trn.config.ranges
    for key in launcher.env:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(key)):
            raise ConfigError("launcher.env", f"'{key}' is not a valid environment variable name.")


def _slurm_conf_text() -> str:
    conf = os.environ.get("SLURM_CONF")
    if conf:
        return f"SLURM_CONF={conf}"
    return f"SLURM_CONF unset (Slurm then reads {DEFAULT_SLURM_CONF} or asks DNS in configless mode)"


def _how_looked() -> str:
    return f"looked for {', '.join(COMMANDS)} on PATH={os.environ.get('PATH', '')} and for the cluster config in {_slurm_conf_text()}"


def partitions() -> tuple[dict[str, int], str | None]:
    """The cluster's partitions with their node counts (``sinfo -h -o %P|%D``) and the default
    one; ConfigError when no Slurm is reachable, saying how it was looked for."""
    missing = [name for name in COMMANDS if shutil.which(name) is None]
    if missing:
        raise ConfigError(
            "launcher",
            f"launcher=slurm, but no Slurm is reachable: {', '.join(missing)} not found ({_how_looked()}). "
            "Submit from a Slurm login node, put Slurm's commands on PATH, or set SLURM_CONF; to try it on one "
            "machine see launchers/slurm/README.md (local_cluster.sh).",
        )
    conf = os.environ.get("SLURM_CONF")
    if conf and not Path(conf).is_file():
        raise ConfigError(
            "launcher",
            f"launcher=slurm, but SLURM_CONF={conf} does not exist ({_how_looked()}); point SLURM_CONF at the cluster's slurm.conf or unset it.",
        )
    try:
        done = subprocess.run(["sinfo", "-h", "-o", "%P|%D"], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        raise ConfigError(
            "launcher", f"launcher=slurm, but `sinfo` got no answer from the Slurm controller in 30 s ({_how_looked()})."
        ) from None
    if done.returncode != 0:
        reason = (done.stderr or done.stdout).strip().splitlines()
        raise ConfigError(
            "launcher",
            f"launcher=slurm, but `sinfo` could not reach the Slurm controller ({reason[-1] if reason else f'exit {done.returncode}'}); {_how_looked()}.",
        )
    nodes: dict[str, int] = {}
    default = None
    for line in done.stdout.splitlines():
        name, _, count = line.strip().partition("|")
        if name.endswith("*"):
            name = name[:-1]
            default = name
        if name:
            nodes[name] = nodes.get(name, 0) + (int(count) if count.strip().isdigit() else 0)
    return nodes, default


def check_cluster(cfg, nnodes: int) -> None:
    """Before submitting: Slurm is reachable, knows ``launcher.partition`` and has the nodes."""
    nodes, default = partitions()
    partition = cfg.launcher.partition
    if partition is not None and partition not in nodes:
        shown = ", ".join(f"{n} (default)" if n == default else n for n in nodes) or "none"
        raise ConfigError(
            "launcher.partition", f"'{partition}' is not a partition of this Slurm cluster ({_slurm_conf_text()}); `sinfo` lists: {shown}."
        )
    if partition is None and default is None and nodes:
        raise ConfigError("launcher.partition", f"this Slurm cluster has no default partition; choose one of {', '.join(nodes)}.")
    chosen = partition or default
    if chosen in nodes and 0 < nodes[chosen] < nnodes:
        raise ConfigError(
            "launcher.nnodes",
            f"{nnodes} nodes were asked for, but partition {chosen} has {nodes[chosen]}; ask for at most {nodes[chosen]} or choose another launcher.partition.",
        )


def _project_root() -> Path | None:
    """The directory holding the qwen3_trn package when it is not installed in site-packages."""
    root = Path(__file__).resolve().parents[3]  # qwen3_trn/launch/slurm/submission.py
    return None if root.name in ("site-packages", "dist-packages") else root


def setup_lines(cfg) -> list[str]:
    """Shell lines of the sbatch script before the job starts: the user's ``launcher.setup``,
    then ``launcher.env`` (e.g. the trn2 presets' Neuron/EFA variables) and the job's own."""
    lines = [str(line) for line in cfg.launcher.setup]
    root = _project_root()
    if root is not None:
        lines.append(f"export PYTHONPATH={shlex.quote(str(root))}${{PYTHONPATH:+:$PYTHONPATH}}")
    for key, value in cfg.launcher.env.items():
        # A secret is not written into the script: it reaches the job through the environment
        # sbatch passes on (its default --export=ALL; see secret_env).
        lines.append(f"# {key}: from the submitting environment" if looks_secret(key) else f"export {key}={shlex.quote(str(value))}")
    lines += [
        "# a requeued job continues its wandb run (same id, from tracking.json)",
        "export WANDB_RESUME=allow",
    ]
    return lines


def secret_env(cfg) -> dict[str, str]:
    """The secret ``launcher.env`` values, for the environment of the ``sbatch`` call."""
    return {key: str(value) for key, value in cfg.launcher.env.items() if looks_secret(key) and not is_redacted(value)}


def _mem(mem_gb: float) -> str:
    return f"{int(mem_gb)}GB" if mem_gb == int(mem_gb) else f"{int(mem_gb * 1024)}MB"


def job_name(cfg) -> str:
    if cfg.launcher.job_name:
        return cfg.launcher.job_name
    run_dir = Path(cfg.output_dir)
    return "qwen3_trn-" + (cfg.run_name or f"{run_dir.parent.name}-{run_dir.name}")


def sbatch_parameters(cfg, nnodes: int) -> dict[str, Any]:
    """submitit ``SlurmExecutor`` parameters (sbatch's names) for this run."""
    launcher = cfg.launcher
    params: dict[str, Any] = {
        "job_name": job_name(cfg),
        "time": time_minutes(launcher.time),
        "nodes": nnodes,
        "ntasks_per_node": 1,
        "signal_delay_s": launcher.signal_delay_s,
        "setup": setup_lines(cfg),
    }
    optional = {
        "partition": launcher.partition,
        "cpus_per_task": launcher.cpus_per_task,
        "gpus_per_node": launcher.gpus_per_node,
        "mem": _mem(launcher.mem_gb) if launcher.mem_gb else None,
        "account": launcher.account,
        "qos": launcher.qos,
        "constraint": launcher.constraint,
    }
    params.update({k: v for k, v in optional.items() if v is not None})
    if launcher.slurm_additional_parameters:
        params["additional_parameters"] = dict(launcher.slurm_additional_parameters)
    return params


def python_command(cfg) -> str:
    return cfg.launcher.python or shlex.quote(sys.executable)


def submitit_command(cfg, folder: Path) -> str:
    """What the sbatch script runs on each node (submitit's ``_submitit_command_str``)."""
    return " ".join([python_command(cfg), "-u -m submitit.core._submit", shlex.quote(str(folder))])


def sbatch_script(cfg, nnodes: int, folder: Path) -> str:
    """The sbatch script submitit writes for this run (rendered here without submitting)."""
    from submitit.slurm.slurm import _make_sbatch_string

    return _make_sbatch_string(command=submitit_command(cfg, folder), folder=folder, **sbatch_parameters(cfg, nnodes))


def rendezvous_port(job_id: str) -> int:
    """The c10d port on the first node of a multi-node job: from the job id, so that jobs sharing
    a node do not collide (``launcher.rdzv_endpoint`` overrides it)."""
    digits = re.sub(r"\D", "", str(job_id)) or "0"
    return 20000 + int(digits) % 10000


def where(cfg, nnodes: int) -> str:
    launcher = cfg.launcher
    parts = [
        f"Slurm partition {launcher.partition}" if launcher.partition else "Slurm (the cluster's default partition)",
        f"{nnodes} node(s) x 1 task",
        f"time {launcher.time} ({time_minutes(launcher.time)} min)",
    ]
    for key in ("account", "qos", "constraint", "cpus_per_task", "gpus_per_node", "mem_gb"):
        if getattr(launcher, key) is not None:
            parts.append(f"{key} {getattr(launcher, key)}")
    return ", ".join(parts)
