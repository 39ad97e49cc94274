"""Two "nodes" on one machine: two elastic agents, one c10d rendezvous, FSDP over gloo —
the code path a real 2-node job takes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import uuid

import pytest

from tests.conftest import REPO, read_metrics, read_summary

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_two_node_fsdp_run_on_one_machine(tmp_path):
    endpoint, run_id = f"127.0.0.1:{_free_port()}", f"twonode-{uuid.uuid4().hex[:8]}"
    common = [
        "launcher.nnodes=2",
        "launcher.nproc_per_node=1",
        f"launcher.rdzv_endpoint={endpoint}",
        f"launcher.rdzv_id={run_id}",
        "parallelism=single",
        "logger=none",
        "training.steps=4",
        "training.seq_len=64",
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    nodes = [
        subprocess.Popen(
            [sys.executable, "-m", "qwen3_trn", *common, f"hydra.run.dir={tmp_path / f'node{n}'}"],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(2)
    ]
    outputs = [node.communicate(timeout=600) for node in nodes]
    for node, (_out, err) in zip(nodes, outputs):
        assert node.returncode == 0, err[-3000:]
    # exactly one node hosted global rank 0 and wrote the metrics
    with_metrics = [n for n in range(2) if (tmp_path / f"node{n}" / "metrics.jsonl").exists()]
    assert len(with_metrics) == 1
    head = tmp_path / f"node{with_metrics[0]}"
    assert [r["step"] for r in read_metrics(head)] == [1, 2, 3, 4]
    summary = read_summary(head)
    assert summary["world_size"] == 2 and "2 node(s) x 1 rank(s)" in summary["layout"] and "dp_shard=2" in summary["layout"]
    rank_logs = sorted(p.name for n in range(2) for p in (tmp_path / f"node{n}" / "logs").glob("rank*.log"))
    assert rank_logs == ["rank0.log", "rank1.log"]
