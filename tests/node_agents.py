"""Multi-node torchrun as a user on several machines starts it: the same ``python -m qwen3_trn``
on each node (``launcher.nnodes``, one c10d rendezvous endpoint), each with a run directory of
its own. On one machine the nodes are processes, each optionally inside a host's namespaces
(tests/test_two_host.py)."""

from __future__ import annotations

import socket
import subprocess
import sys
import uuid
from pathlib import Path

from qwen3_trn.results.records import METRICS_FILE
from tests.commands import REPO, cli_env


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def run_node_agents(run_root: Path, endpoint: str, overrides: list[str], prefixes: tuple[list[str], ...] = ([], [])) -> list[Path]:
    """One agent per entry of ``prefixes`` (the command prefix that puts it on its host), all
    joining one rendezvous at ``endpoint``; returns their run directories, node0, node1, ..."""
    run_id = f"nodes-{uuid.uuid4().hex[:8]}"
    common = [f"launcher.nnodes={len(prefixes)}", f"launcher.rdzv_endpoint={endpoint}", f"launcher.rdzv_id={run_id}", *overrides]
    dirs = [run_root / f"node{n}" for n in range(len(prefixes))]
    agents = [
        subprocess.Popen(
            [*prefix, sys.executable, "-m", "qwen3_trn", *common, f"hydra.run.dir={run_dir}"],
            cwd=REPO,
            env=cli_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for prefix, run_dir in zip(prefixes, dirs)
    ]
    try:
        outputs = [agent.communicate(timeout=300) for agent in agents]
    finally:
        for agent in agents:
            if agent.poll() is None:
                agent.kill()
                agent.wait()
    for agent, (_out, err) in zip(agents, outputs):
        assert agent.returncode == 0, err[-3000:]
    return dirs


def head_node(run_dirs: list[Path]) -> Path:
    """The one run directory with metrics: its node hosted global rank 0."""
    with_metrics = [d for d in run_dirs if (d / METRICS_FILE).exists()]
    assert len(with_metrics) == 1, with_metrics
    return with_metrics[0]
