"""The schema of every option of the ``backend``, ``launcher`` and ``data`` groups.

Each is the ``Config`` of the class in a higher layer that implements the option and becomes its
``_owner``. They live here so that composing and checking a config imports neither torch nor
torchtitan. A new option is its Config here, its class, and its ``conf/<group>/<name>.yaml``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import MISSING

from qwen3_trn.config.keys import PathKind, key
from qwen3_trn.config.paths import DATA_FILE_KINDS
from qwen3_trn.config.schema import BackendConfig, DataConfig, LauncherConfig, RendezvousBackend

# backend (qwen3_trn.backends)


@dataclass
class NativeBackendConfig(BackendConfig):
    """torchtitan's own Qwen3."""

    name: str = "native"


@dataclass
class HfV5BackendConfig(BackendConfig):
    """Qwen3 built by Transformers v5 in torchtitan's transformers modeling backend."""

    name: str = "hf_v5"
    # Hugging Face experts implementation of an MoE (None keeps torchtitan's default).
    hf_experts_implementation: Optional[str] = None


@dataclass
class NkiMoeBackendConfig(BackendConfig):
    """Qwen3 MoE whose experts run project-registered kernels."""

    name: str = "nki_moe"
    # auto (the device's fastest kernel: torch._grouped_mm on Neuron, as AWS measured for Neuron 2.34;
    # qwen3_trn.kernels.DEVICE_KERNELS) | torchtitan_neuron | nki | portable | <kernel name>
    kernels: str = "auto"


# launcher (qwen3_trn.launch)


@dataclass
class LocalLauncherConfig(LauncherConfig):
    """Ranks on this machine."""

    name: str = "local"
    rdzv_backend: RendezvousBackend = RendezvousBackend.c10d
    # Device packing for concurrent jobs on one machine: each job claims this many devices
    # (GPUs, NeuronCores or CPU cores) exclusively and waits while too few are free. 0: off.
    devices_per_job: int = key(0, ge=0, note="0: no device packing")


@dataclass
class SlurmLauncherConfig(LauncherConfig):
    """One Slurm job per run, submitted through submitit (``qwen3_trn.launch.slurm``)."""

    name: str = "slurm"
    # Slurm partition (None: the cluster's default); checked against `sinfo` before submitting.
    partition: Optional[str] = None
    # Time limit in Slurm's format: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS.
    time: str = "60"
    cpus_per_task: Optional[int] = key(None, ge=1)
    gpus_per_node: Optional[int] = key(None, ge=1)
    mem_gb: Optional[float] = key(None, gt=0)
    account: Optional[str] = None
    qos: Optional[str] = None
    constraint: Optional[str] = None
    job_name: Optional[str] = None
    # true: block until the job ends and report like a local run; false: print the job id and return.
    wait: bool = False
    # Shell lines run in the sbatch script before the job starts (module load, source venv ...).
    setup: list[str] = field(default_factory=list)
    # Any other sbatch option, e.g. {exclusive: true, "mail-type": END}.
    slurm_additional_parameters: dict[str, Any] = field(default_factory=dict)
    # Seconds before the time limit at which Slurm signals the job to requeue itself (USR2).
    signal_delay_s: int = key(120, ge=0)
    # How many times a job may be requeued after hitting its time limit.
    max_requeues: int = key(3, ge=0)
    # Python on the nodes (None: this interpreter, which must be reachable there).
    python: Optional[str] = None


# data (qwen3_trn.data.sources)


@dataclass
class EmbeddedSourceConfig(DataConfig):
    """Text shipped with the project, with its own held-out split: trains offline."""

    name: str = "embedded"


@dataclass
class SplitSourceConfig(DataConfig):
    """The keys of a source that holds out part of its documents (``SplitSource``)."""

    path: str = MISSING
    text_column: str = "text"
    # local files like ``path`` holding the held-out text
    val_path: Optional[str] = key(None, path=PathKind.data_files)
    val_fraction: float = key(0.01, ge=0, lt=1, note="the held-out share of the documents; 0 with data.val_path or validation=off")


@dataclass
class FilesSourceConfig(SplitSourceConfig):
    """Local text files. Validation reads ``val_path``, else holds out ``val_fraction`` of the
    documents (0: none)."""

    name: str = "files"
    path: str = key(
        MISSING, path=PathKind.data_files, hint=f"data=files needs data.path=<file | directory | glob> of {DATA_FILE_KINDS} files"
    )


@dataclass
class HubSourceConfig(SplitSourceConfig):
    """A Hugging Face dataset by id (``path``). Validation reads ``val_path``, else ``val_split``,
    else holds out ``val_fraction`` of the documents."""

    name: str = "hub"
    path: str = key(
        MISSING,
        path=PathKind.local_or_hub_id,
        hint="data=hub needs data.path=<dataset id on the Hugging Face hub>, e.g. data.path=roneneldan/TinyStories",
    )
    # The dataset's subset (its configuration name, ``load_dataset(path, name=...)``).
    subset: Optional[str] = None
    split: str = "train"
    streaming: bool = True
    val_split: Optional[str] = None


@dataclass
class C4SourceConfig(DataConfig):
    """torchtitan's C4 (allenai/c4, English, streamed); validation uses its validation split."""

    name: str = "c4"
    # A local copy of allenai/c4 (None: the hub).
    path: Optional[str] = key(None, path=PathKind.local_or_hub_id)
    split: str = "train"
