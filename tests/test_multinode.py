"""Two "nodes" on one machine: two elastic agents, one c10d rendezvous, FSDP over gloo —
the code path a real 2-node job takes (the session's ``loopback_2x2_run``)."""

from __future__ import annotations

import pytest

from qwen3_trn.results.records import read_metrics, read_summary
from tests.node_agents import head_node

pytestmark = pytest.mark.slow


def test_two_node_fsdp_run_on_one_machine(loopback_2x2_run):
    # exactly one node hosted global rank 0 and wrote the metrics
    head = head_node(loopback_2x2_run)
    assert [r["step"] for r in read_metrics(head)] == [1, 2, 3]
    summary = read_summary(head)
    assert summary["world_size"] == 4 and "2 node(s) x 2 rank(s)" in summary["layout"] and "dp_shard=4" in summary["layout"], summary
    rank_logs = sorted(p.name for node in loopback_2x2_run for p in (node / "logs").glob("rank*.log"))
    assert rank_logs == ["rank0.log", "rank1.log", "rank2.log", "rank3.log"]
