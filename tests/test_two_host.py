"""Multi-node runs across two hosts on one machine: a Slurm cluster whose two compute hosts are
network + UTS namespaces with their own hostname and address (tests/slurm_cluster.py
``two_host_cluster``; launchers/slurm/local_cluster.sh with QWEN3_TRN_SLURM_HOSTS=2), and
multi-node torchrun with one node agent in each of two namespaces.

Skipped, with the reason, where Slurm is not installed or the tests do not run as root.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
from pathlib import Path

import pytest

from qwen3_trn.results.records import read_metrics, read_summary
from tests.commands import rank_processes
from tests.conftest import TWO_BY_TWO_TRAINING, compose_config
from tests.node_agents import free_port, head_node, run_node_agents
from tests.slurm_cluster import SlurmCluster, two_host_cluster, two_host_env, wait_for_state  # noqa: F401
from tests.test_launcher_slurm import _job_log, _wait_until

try:
    import submitit
except ImportError:
    submitit = None

pytestmark = [pytest.mark.slow, pytest.mark.skipif(submitit is None, reason="submitit is not installed (pip install -e '.[slurm]')")]

TINY = ["debug=smoke"]  # the smallest run (conf/debug/smoke.yaml)
TWO_BY_TWO = ["launcher=slurm", "launcher.partition=cpu", "launcher.nnodes=2", "launcher.nproc_per_node=2", "parallelism=fsdp"]


def _execute(overrides: list[str], run_dir: Path) -> dict | None:
    from qwen3_trn.app import execute

    return execute(compose_config(overrides, run_dir))


def _address(name: str) -> str:
    return socket.gethostbyname(name)


def _in_host(cluster: SlurmCluster, node: str) -> list[str]:
    """The command prefix that runs a process on compute host ``node`` of the cluster: in its
    network namespace and a UTS namespace with its hostname, as slurmd's processes run."""
    port = cluster.script_env["QWEN3_TRN_SLURM_PORT"]
    index = cluster.nodes.index(node) + 1
    return [
        "nsenter",
        f"--net=/run/netns/qwen3trn-{port}-{index}",
        "unshare",
        "--uts",
        "sh",
        "-c",
        'hostname "$1"; shift; exec "$@"',
        "sh",
        node,
    ]


def _placements(run_dirs: list[Path]) -> dict[int, str]:
    """rank -> the placement line its log starts with (qwen3_trn.run.worker.log_placement)."""
    found = {}
    for run_dir in run_dirs:
        for log in (run_dir / "logs").glob("rank*.log"):
            for line in log.read_text(errors="replace").splitlines():
                match = re.search(r"rank (\d+)/\d+ on host (.*)", line)
                if match:
                    found[int(match.group(1))] = match.group(2)
                    break
    return found


# AWS's multi-node recipe (conf/experiment/trn2_multinode.yaml: its Neuron/EFA environment, one
# job of two nodes) on CPU ranks, sharded over the whole world as the one-host reference is.
TRN2_ON_CPU = [
    "experiment=trn2_multinode",
    "device=cpu",
    "parallelism.dp_replicate=1",
    "parallelism.dp_shard=-1",
    "parallelism.tp=1",
    "training.activation_checkpoint=none",
]
TRN2_ENV = "NEURON_LOGICAL_NC_CONFIG=2, FI_PROVIDER=efa, FI_EFA_USE_DEVICE_RDMA=1, FI_EFA_FORK_SAFE=1"


def test_two_host_fsdp_2x2_across_hosts_matches_the_same_ranks_on_one_host(two_host_env: SlurmCluster, loopback_2x2_run, tmp_path: Path):
    """The trn2_multinode experiment as a 2-node x 2-rank Slurm job on the two hosts: each rank
    gets the experiment's environment, and the losses equal the same 4 ranks on one host."""
    first, second = two_host_env.nodes
    run_dir = tmp_path / "2x2"
    _execute([*TRN2_ON_CPU, *TWO_BY_TWO, *TWO_BY_TWO_TRAINING, "launcher.wait=true"], run_dir)
    summary = read_summary(run_dir)
    assert summary["status"] == "completed", _job_log(run_dir)[-3000:]
    slurm = summary["job"]
    assert wait_for_state(slurm["id"], "COMPLETED", timeout=120, env=two_host_env.env) == "COMPLETED"
    # both hosts ran a task of the job; the c10d rendezvous was on the first node's name, whose
    # address is its namespace's (not loopback, not the second host's)
    assert slurm["hostnames"] == [first, second], slurm
    host, _, port = slurm["rendezvous"].rpartition(":")
    assert host == first and port.isdigit(), slurm
    assert not _address(host).startswith("127.") and _address(host) != _address(second)
    assert "2 node(s) x 2 rank(s)" in summary["layout"] and summary["world_size"] == 4, summary
    # ranks 0-1 ran on the first host, 2-3 on the second (each rank's log says where), each with
    # the experiment's Neuron/EFA variables, exported by the sbatch script, in its process
    hosts = _placements([run_dir])
    assert {rank: where.split()[0] for rank, where in hosts.items()} == {0: first, 1: first, 2: second, 3: second}, hosts
    assert all(where.endswith(f"launcher.env here: {TRN2_ENV}") for where in hosts.values()), hosts
    submitted = Path(slurm["submission_file"]).read_text()
    assert "export FI_PROVIDER=efa" in submitted and "#SBATCH --nodes=2" in submitted

    # The same 4 ranks (2 agents x 2) on one host over loopback: the same losses, bitwise.
    across = [r["loss"] for r in read_metrics(run_dir)]
    same_host = [r["loss"] for r in read_metrics(head_node(loopback_2x2_run))]
    assert len(across) == 3 and across == same_host, (across, same_host)


def test_two_host_torchrun_between_two_namespaces(two_host_cluster: SlurmCluster, tmp_path: Path):
    """Without Slurm: one node agent in each host's namespaces, the rendezvous endpoint on the
    first host's name (its address on the private subnet), as on two machines."""
    first, second = two_host_cluster.nodes
    endpoint = f"{first}:{free_port()}"
    prefixes = (_in_host(two_host_cluster, first), _in_host(two_host_cluster, second))
    dirs = run_node_agents(tmp_path, endpoint, ["launcher.nproc_per_node=1", "parallelism=fsdp", *TINY, "training.steps=2"], prefixes)
    assert head_node(dirs) == dirs[0], "global rank 0 is on the host of the rendezvous endpoint"
    head = dirs[0]
    assert [r["step"] for r in read_metrics(head)] == [1, 2]
    summary = read_summary(head)
    assert summary["world_size"] == 2 and "2 node(s) x 1 rank(s)" in summary["layout"], summary
    hosts = _placements(dirs)
    assert {rank: where.split()[0] for rank, where in hosts.items()} == {0: first, 1: second}, hosts
    # the second host reaches the first only over the subnet: its loopback is its own
    assert not _address(first).startswith("127.")


def _ended(run_dir: Path, timeout: float) -> dict:
    from qwen3_trn.launch.slurm import SlurmLauncher

    return _wait_until(
        lambda: next((s for s in SlurmLauncher.refresh([run_dir]) if s["status"] in ("completed", "failed", "cancelled")), None),
        timeout,
        "the job's end",
        poll=1,
    )


TWO_NODES = ["launcher=slurm", "launcher.partition=cpu", "launcher.nnodes=2", "launcher.nproc_per_node=1", "parallelism=fsdp"]


def test_two_host_requeued_job_resumes_with_the_same_wandb_run(two_host_env: SlurmCluster, tmp_path: Path):
    run_dir = tmp_path / "run"
    overrides = [*TWO_NODES, *TINY, "logger=wandb", "training.steps=8", "checkpoint=on", "checkpoint.interval=2"]
    summary = _execute(overrides, run_dir)
    job_id = summary["job"]["id"]
    _wait_until(lambda: (run_dir / "checkpoint" / "step-2" / ".metadata").is_file(), 180, "the first checkpoint")
    # what a preemption or a time limit does: USR2 to the job, submitit's checkpoint hook, requeue
    submitit.SlurmJob(folder=run_dir / "slurm", job_id=job_id)._interrupt(timeout=False)
    final = _ended(run_dir, 240)
    assert final["status"] == "completed", _job_log(run_dir)[-3000:]
    runs = two_host_env.run("sacct", "-n", "-D", "-X", "-P", "-j", job_id, "-o", "State").stdout.split()
    assert runs == ["REQUEUED", "COMPLETED"], runs

    summary = read_summary(run_dir)
    records = read_metrics(run_dir)
    steps = [r["step"] for r in records]
    first_run = [r["step"] for r in records if r["time"] < summary["job"]["started"]]
    second_run = [r["step"] for r in records if r["time"] >= summary["job"]["started"]]
    assert first_run and second_run and first_run + second_run == steps, steps
    # no gap, no repeated step: the second run starts right after the last step the first logged
    # (it resumed from a checkpoint at or before it, and logs only the steps after that line)
    assert steps == list(range(1, 9)), steps
    assert summary["job"]["restarts"] == 1 and summary["job"]["hostnames"] == list(two_host_env.nodes), summary
    run_id = json.loads((run_dir / "tracking.json").read_text())["wandb"]["id"]
    assert summary["wandb_run_id"] == run_id
    offline = sorted(p.name for p in (run_dir / "wandb").glob("offline-run-*"))
    assert len(offline) == 2 and all(name.endswith(f"-{run_id}") for name in offline), offline


def _rank_pids(namespace: str) -> list[int]:
    """The training ranks (started by torch elastic's agent) running in a network namespace."""
    pids = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True, check=True).stdout.split()
    return rank_processes([int(pid) for pid in pids])


def test_two_host_ranks_of_one_node_killed_fail_the_job_and_it_resumes(two_host_env: SlurmCluster, tmp_path: Path):
    first, second = two_host_env.nodes
    run_dir = tmp_path / "run"
    common = [*TWO_NODES, *TINY, "checkpoint=on", "checkpoint.interval=2", "checkpoint.keep_latest_k=0"]
    _execute([*common, "training.steps=400"], run_dir)
    _wait_until(lambda: (run_dir / "checkpoint" / "step-4" / ".metadata").is_file(), 180, "the second checkpoint")
    port = two_host_env.script_env["QWEN3_TRN_SLURM_PORT"]
    victims = _wait_until(lambda: _rank_pids(f"qwen3trn-{port}-2"), 120, "the second node's ranks")
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    final = _ended(run_dir, 180)
    assert final["status"] == "failed", final
    summary = read_summary(run_dir)
    assert summary["job"]["state"] == "FAILED"
    # the error names the node whose ranks died, and why, first
    assert summary["error"].startswith(f"Slurm job {summary['job']['id']} FAILED: node {second} (#1): rank 1 failed: Signal 9 (SIGKILL)"), (
        summary["error"]
    )
    assert wait_for_state(summary["job"]["id"], "FAILED", timeout=120, env=two_host_env.env) == "FAILED"

    # the checkpoints written before stay loadable: a 2-node job resumes from the latest and continues
    saved = sorted(int(p.name.split("-")[1]) for p in (run_dir / "checkpoint").glob("step-*") if (p / ".metadata").is_file())
    assert saved and saved[0] == 2, saved
    last = saved[-1]
    resumed = tmp_path / "resumed"
    _execute([*common, f"training.steps={last + 2}", f"checkpoint.resume_from={run_dir}", "launcher.wait=true"], resumed)
    summary = read_summary(resumed)
    assert summary["status"] == "completed", _job_log(resumed)[-3000:]
    assert summary["resumed_from"] == str(run_dir / "checkpoint" / f"step-{last}"), summary
    assert [r["step"] for r in read_metrics(resumed)] == [last + 1, last + 2]
    assert first in summary["job"]["hostnames"]
