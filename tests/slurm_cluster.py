"""A real one-node Slurm cluster for tests (helper module, not a test file).

Usage in a test module::

    from tests.slurm_cluster import SlurmCluster, slurm_cluster, slurm_env, wait_for_state  # noqa: F401

    def test_something(slurm_cluster: SlurmCluster):
        job_id = slurm_cluster.sbatch("-p", "cpu", "-o", "/dev/null", "--wrap", "true")
        assert wait_for_state(job_id, "COMPLETED", timeout=30) == "COMPLETED"

    def test_with_submitit(slurm_env: SlurmCluster, tmp_path):  # SLURM_CONF is in os.environ here
        executor = submitit.AutoExecutor(folder=tmp_path, cluster="slurm")
        ...

(Or add ``pytest_plugins = ["tests.slurm_cluster"]`` to tests/conftest.py and skip the import.)

``slurm_cluster`` is session-scoped: launchers/slurm/local_cluster.sh starts the cluster once,
into a fresh state directory /tmp/qwen3_trn_slurm_* on free ports, and stops it at the end of
the session (then deletes the directory unless QWEN3_TRN_SLURM_KEEP=1), however many test modules
import the fixture. Tests that use it are skipped, with the reason, when the Slurm packages are
not installed (install: launchers/slurm/install_debian.sh) or the tests do not run as root.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LOCAL_CLUSTER = REPO / "launchers" / "slurm" / "local_cluster.sh"
INSTALL = REPO / "launchers" / "slurm" / "install_debian.sh"

# Binaries local_cluster.sh needs, in the order they are looked for.
REQUIRED_BINARIES = ("slurmctld", "slurmd", "slurmdbd", "sbatch", "sacct", "sacctmgr", "munged", "mariadbd")
# /usr/sbin is not on every user's PATH.
_SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin", "/usr/local/sbin"])

# Slurm states after which a job does not run again.
# (Not PREEMPTED: with PreemptMode=REQUEUE a preempted job runs again.)
FINAL_STATES = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "BOOT_FAIL", "DEADLINE"})


@dataclass
class SlurmCluster:
    """A running local cluster. ``env`` is os.environ plus what clients need (SLURM_CONF)."""

    state_dir: Path
    env: dict[str, str]
    partitions: tuple[str, ...] = ("debug", "cpu")
    default_partition: str = "debug"
    # QOS whose jobs preempt (requeue) running jobs of QOS "normal"; see launchers/slurm/README.md.
    preempting_qos: str = "high"
    # How long `local_cluster.sh start` took.
    start_seconds: float = 0.0
    # The env local_cluster.sh runs with (state directory, ports), for `stop` and `status`.
    script_env: dict[str, str] = field(default_factory=dict, repr=False)
    # The compute nodes (NodeName; with hosts > 1 each in its own network + UTS namespace).
    nodes: tuple[str, ...] = ()

    @property
    def slurm_conf(self) -> str:
        return self.env["SLURM_CONF"]

    def run(self, *cmd: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        """Run a Slurm client command (sbatch, squeue, scontrol ...) against this cluster."""
        return subprocess.run(list(cmd), env=self.env, capture_output=True, text=True, check=check, timeout=timeout)

    def sbatch(self, *args: str) -> str:
        """``sbatch --parsable ARGS``; returns the job id."""
        out = self.run("sbatch", "--parsable", *args).stdout.strip()
        return out.split(";")[0]

    def wait_for_running(self, job_id: str, timeout: float = 30) -> None:
        """Wait until slurmctld runs the job (squeue: immediate; sacct shows RUNNING up to ~5 s
        later, when slurmctld has sent the job's start to slurmdbd)."""
        deadline = time.monotonic() + timeout
        while True:
            state = self.run("squeue", "-h", "-j", str(job_id), "-o", "%T", check=False).stdout.strip()
            if state == "RUNNING":
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job_id} not RUNNING after {timeout} s (squeue: {state!r})")
            time.sleep(0.1)

    def logs(self, tail: int = 40) -> str:
        """The last lines of every daemon log, for assertion messages."""
        parts = []
        for path in sorted((self.state_dir / "log").glob("*.log")):
            lines = path.read_text(errors="replace").splitlines()[-tail:]
            parts.append(f"--- {path}\n" + "\n".join(lines))
        return "\n".join(parts)


# One cluster per session even when several test modules import the fixture (pytest then makes
# one session fixture per module): the first use starts it, the last teardown stops it.
_cluster: SlurmCluster | None = None  # the one-node cluster (job_state's default env)
_clusters: dict[int, SlurmCluster] = {}  # by number of compute hosts
_users: dict[int, int] = {}


PORT_LOCK = Path(tempfile.gettempdir()) / "qwen3_trn_slurm_ports.lock"


def _missing_binary() -> str | None:
    for name in REQUIRED_BINARIES:
        if shutil.which(name, path=_SEARCH_PATH) is None:
            return name
    return None


def _ports_free(base: int, count: int = 4) -> bool:
    for port in range(base, base + count):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                return False
    return True


def _free_port_base() -> int:
    # Away from Slurm's own 6817-6819 and local_cluster.sh's default 16817 (a cluster a user
    # started by hand keeps running); 4 consecutive ports: slurmctld, slurmd, slurmdbd, MariaDB.
    for base in range(26817, 27817, 4):
        if _ports_free(base):
            return base
    raise RuntimeError("no 4 free consecutive TCP ports on 127.0.0.1 in 26817-27816")


def _script(command: str, env: dict[str, str], timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(LOCAL_CLUSTER), command], env=env, capture_output=True, text=True, timeout=timeout)


def start_cluster(state_dir: Path, hosts: int = 1) -> SlurmCluster:
    """Start a cluster into ``state_dir`` (skips the test when Slurm is not installed); with
    ``hosts`` > 1, that many compute hosts, each in network and UTS namespaces of its own."""
    missing = _missing_binary()
    if missing is not None:
        pytest.skip(
            f"Slurm is not installed: no `{missing}` on PATH or in /usr/sbin "
            f"(looked for {', '.join(REQUIRED_BINARIES)}); install with `sudo bash {INSTALL.relative_to(REPO)}`"
        )
    if os.geteuid() != 0:
        pytest.skip(
            f"the local Slurm cluster runs its daemons as root (slurmd starts jobs as the submitting user); "
            f"run the tests as root or start {LOCAL_CLUSTER.relative_to(REPO)} with sudo"
        )
    t0 = time.monotonic()
    # Clusters started at once (the suite's parallel workers, two suites) would find the same
    # free ports: the choice and the start that binds them are one step under a machine-wide lock.
    with open(PORT_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        env = {
            **os.environ,
            "PATH": _SEARCH_PATH,
            "QWEN3_TRN_SLURM_DIR": str(state_dir),
            "QWEN3_TRN_SLURM_PORT": str(_free_port_base()),
            "QWEN3_TRN_SLURM_HOSTS": str(hosts),
            # submitit caches job states by id in this process: each cluster its own ids
            "QWEN3_TRN_SLURM_FIRST_JOB_ID": str(1 + 100_000 * (hosts - 1)),
        }
        result = _script("start", env)
    elapsed = time.monotonic() - t0
    if result.returncode != 0:
        logs = ""
        for path in sorted((state_dir / "log").glob("*.log")):
            logs += f"\n--- {path}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-30:])
        _script("stop", env)  # the script stops what it started on failure; make sure
        pytest.fail(
            f"{LOCAL_CLUSTER.name} start failed (exit {result.returncode}):\n{result.stdout}\n{result.stderr}{logs}",
            pytrace=False,
        )
    client_env = {k: v for k, v in env.items() if not k.startswith("QWEN3_TRN_SLURM_")}
    for line in result.stdout.splitlines():
        if line.startswith("export ") and "=" in line:
            key, _, value = line[len("export ") :].partition("=")
            client_env[key] = value
    assert "SLURM_CONF" in client_env, result.stdout
    nodes = subprocess.run(["sinfo", "-h", "-N", "-p", "cpu", "-o", "%N"], env=client_env, capture_output=True, text=True, timeout=30)
    return SlurmCluster(
        state_dir=state_dir, env=client_env, start_seconds=elapsed, script_env=env, nodes=tuple(sorted(set(nodes.stdout.split())))
    )


def stop_cluster(cluster: SlurmCluster) -> subprocess.CompletedProcess:
    return _script("stop", cluster.script_env)


def _state_dir() -> Path:
    # Not under pytest's tmp_path: munged refuses a socket whose parent directories are not
    # searchable by everyone, and pytest's base temp directory is mode 700. Short, too: unix
    # socket paths (munge, MariaDB) must stay under 108 bytes.
    path = Path(tempfile.mkdtemp(prefix="qwen3_trn_slurm_", dir="/tmp" if os.path.isdir("/tmp") else None))
    path.chmod(0o755)
    return path


def _shared_cluster(hosts: int):
    """The session's cluster of ``hosts`` compute hosts: started by its first user, stopped (and
    its state directory removed unless QWEN3_TRN_SLURM_KEEP=1) after its last."""
    global _cluster
    if hosts not in _clusters:
        state_dir = _state_dir()
        try:
            _clusters[hosts] = start_cluster(state_dir, hosts=hosts)
        except BaseException:
            if os.environ.get("QWEN3_TRN_SLURM_KEEP") != "1" and not (state_dir / "log").is_dir():
                shutil.rmtree(state_dir, ignore_errors=True)
            raise
        if hosts == 1:
            _cluster = _clusters[hosts]
    _users[hosts] = _users.get(hosts, 0) + 1
    try:
        yield _clusters[hosts]
    finally:
        _users[hosts] -= 1
        if _users[hosts] == 0 and hosts in _clusters:
            cluster = _clusters.pop(hosts)
            if hosts == 1:
                _cluster = None
            result = stop_cluster(cluster)
            if result.returncode != 0:
                raise RuntimeError(f"local_cluster.sh stop failed:\n{result.stdout}\n{result.stderr}")
            if os.environ.get("QWEN3_TRN_SLURM_KEEP") != "1":
                shutil.rmtree(cluster.state_dir, ignore_errors=True)


def _with_client_env(cluster: SlurmCluster, monkeypatch: pytest.MonkeyPatch) -> SlurmCluster:
    for key, value in cluster.env.items():
        if (key == "PATH" or key.startswith("SLURM_")) and os.environ.get(key) != value:
            monkeypatch.setenv(key, value)
    return cluster


@pytest.fixture(scope="session")
def slurm_cluster():
    """A running one-node Slurm cluster: ``.env`` (SLURM_CONF ...), ``.partitions``, ``.state_dir``.

    The state directory (/tmp/qwen3_trn_slurm_*, with the daemons' logs under log/) is removed
    after the session unless QWEN3_TRN_SLURM_KEEP=1.
    """
    yield from _shared_cluster(1)


@pytest.fixture
def slurm_env(slurm_cluster: SlurmCluster, monkeypatch: pytest.MonkeyPatch) -> SlurmCluster:
    """The cluster, with its client env (SLURM_CONF, PATH) set in os.environ for this test, as
    code that calls Slurm itself (submitit, the launcher) needs."""
    return _with_client_env(slurm_cluster, monkeypatch)


def _skip_without_namespaces() -> None:
    missing = [name for name in ("ip", "unshare", "nsenter") if shutil.which(name, path=_SEARCH_PATH) is None]
    if missing:
        pytest.skip(f"a cluster of two hosts needs network namespaces: {', '.join(missing)} not found (iproute2, util-linux)")


@pytest.fixture(scope="session")
def two_host_cluster():
    """A running Slurm cluster of two compute hosts on this machine (``.nodes``): each slurmd in
    its own network and UTS namespace, with its own hostname and address on a private bridge
    (launchers/slurm/local_cluster.sh with QWEN3_TRN_SLURM_HOSTS=2). Stopped, its namespaces,
    veths, bridge and /etc/hosts lines removed, after the session."""
    _skip_without_namespaces()
    yield from _shared_cluster(2)


@pytest.fixture
def two_host_env(two_host_cluster: SlurmCluster, monkeypatch: pytest.MonkeyPatch) -> SlurmCluster:
    """The two-host cluster with its client env set in os.environ for this test."""
    return _with_client_env(two_host_cluster, monkeypatch)


def job_state(job_id: str, env: dict[str, str] | None = None) -> str:
    """The job's state as sacct reports it ("" before slurmdbd has it); "CANCELLED by 0" -> "CANCELLED"."""
    if env is None:
        env = _cluster.env if _cluster is not None else dict(os.environ)
    result = subprocess.run(
        ["sacct", "-n", "-X", "-P", "-j", str(job_id), "-o", "State"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    lines = [line.strip() for line in result.stdout.splitlines() if line.strip()]
    return lines[-1].split()[0] if lines else ""


def wait_for_state(
    job_id: str,
    states: str | set[str] | frozenset[str] | list[str] | tuple[str, ...],
    timeout: float = 60,
    env: dict[str, str] | None = None,
    poll: float = 0.25,
) -> str:
    """Poll sacct until job ``job_id`` is in one of ``states``; return that state.

    sacct is what submitit reads. It has a job's end state (COMPLETED, FAILED, CANCELLED ...) at
    once, but shows RUNNING only up to ~5 s after the job started: to wait for a job to start,
    ``SlurmCluster.wait_for_running`` (squeue) is quicker.

    Fails (AssertionError) on timeout, or early when the job reached a final state that is not in
    ``states`` (e.g. FAILED while waiting for COMPLETED). ``env`` defaults to the running
    cluster's client env.
    """
    wanted = {states} if isinstance(states, str) else set(states)
    deadline = time.monotonic() + timeout
    seen: list[str] = []
    while True:
        state = job_state(job_id, env)
        if not seen or seen[-1] != state:
            seen.append(state)
        if state in wanted:
            return state
        if state in FINAL_STATES:
            raise AssertionError(f"job {job_id} ended {state}, wanted {sorted(wanted)} (states seen: {seen})")
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id} not in {sorted(wanted)} after {timeout} s (states seen: {seen})")
        time.sleep(poll)
