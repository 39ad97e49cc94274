"""Typed schema of every config group.

Each group is a dataclass registered in Hydra's ConfigStore (see ``store.py``), so unknown
keys, wrong types and misspelled group options fail at composition time with Hydra's own
messages. The YAML files under ``conf/`` only choose values inside these shapes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import MISSING


@dataclass
class BackendConfig:
    """Which training mode builds the model (a key of ``qwen3_trn.backends.BACKENDS``)."""

    name: str = "native"
    # Expert-kernel implementation for backend=nki_moe: auto | nki | portable | <impl name>.
    kernels: str = "auto"
    # Hugging Face experts implementation for backend=hf_v5 (None keeps Transformers' default).
    hf_experts_implementation: Optional[str] = None


@dataclass
class ModelConfig:
    """A torchtitan Qwen3 flavor plus architecture overrides (None keeps the flavor's value)."""

    flavor: str = "debugmodel"
    n_layers: Optional[int] = None
    dim: Optional[int] = None
    n_heads: Optional[int] = None
    n_kv_heads: Optional[int] = None
    head_dim: Optional[int] = None
    hidden_dim: Optional[int] = None
    vocab_size: Optional[int] = None
    max_seq_len: Optional[int] = None
    rope_theta: Optional[float] = None
    num_experts: Optional[int] = None
    top_k: Optional[int] = None
    moe_hidden_dim: Optional[int] = None
    # auto (sdpa on CPU and Neuron, flex on CUDA) | flex | flex_flash | varlen | sdpa
    attention: str = "auto"
    # Tokenizer / HF assets directory; None uses the tokenizer the project ships.
    hf_assets_path: Optional[str] = None
    # Hub id or local directory holding config.json (backend=hf_v5).
    hf_model: Optional[str] = None


@dataclass
class ParallelismConfig:
    """Parallel degrees; ``-1`` means "whatever is left of the world size"."""

    dp_replicate: int = 1
    dp_shard: int = -1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    pp_schedule: str = "1F1B"
    pp_microbatch_size: int = 1
    fsdp_reshard_after_forward: str = "default"


@dataclass
class CompileConfig:
    """torch.compile: backend ``off`` disables it."""

    backend: str = "off"
    components: list[str] = field(default_factory=lambda: ["model", "loss"])


@dataclass
class DataConfig:
    """Where training text comes from (a key of ``qwen3_trn.data.sources.DATA_SOURCES``)."""

    source: str = "embedded"
    # files: a file, directory or glob of .jsonl/.json/.parquet/.txt; hub: a dataset id.
    path: Optional[str] = None
    name: Optional[str] = None
    split: str = "train"
    text_column: str = "text"
    streaming: bool = False
    num_workers: int = 0
    # Held-out text for validation (qwen3_trn.data.sources). embedded ships its own and c4 has
    # torchtitan's validation split; files/hub take, in this order: val_path (local files, as
    # path), val_split (hub: a split of the same dataset), else val_fraction of the documents,
    # which training then never sees (0: none held out).
    val_path: Optional[str] = None
    val_split: Optional[str] = None
    val_fraction: float = 0.01


@dataclass
class TrainingConfig:
    steps: int = 40
    local_batch_size: int = 2
    global_batch_size: int = -1
    seq_len: int = 256
    dtype: str = "float32"
    # auto: bf16 where the device computes it natively (GPU, Trainium, AMX CPUs), else fp32.
    mixed_precision_param: str = "auto"
    max_norm: float = 1.0
    seed: int = 42
    deterministic: bool = False
    gc_freq: int = 50
    activation_checkpoint: str = "none"


@dataclass
class OptimizerConfig:
    name: str = "AdamW"
    lr: float = 3.0e-3
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1.0e-8
    warmup_steps: int = 4
    decay_ratio: Optional[float] = None
    decay_type: str = "linear"
    min_lr_factor: float = 0.0


@dataclass
class CheckpointConfig:
    enable: bool = False
    interval: int = 500
    folder: str = "checkpoint"
    keep_latest_k: int = 3
    # A previous run directory (or one of its step-N checkpoint folders) to resume from.
    resume_from: Optional[str] = None
    load_step: int = -1
    # Weights to start from (DCP folder, or HF safetensors folder with initial_load_in_hf).
    initial_load_path: Optional[str] = None
    initial_load_in_hf: bool = False
    # Hugging Face model folders <run dir>/<hf_folder>/step-N (config.json, tokenizer, generation
    # config, safetensors in export_dtype) at the last step, and every hf_interval steps if > 0.
    hf_export: bool = False
    hf_interval: int = 0
    hf_folder: str = "hf"
    export_dtype: str = "float32"


@dataclass
class ValidationConfig:
    """Held-out loss through torchtitan's Validator (``qwen3_trn.validation``): after step 1,
    every ``interval`` steps and at the last step, on the same tokens each time."""

    enable: bool = True
    interval: int = 10
    # Batches per validation; -1: the whole held-out split.
    steps: int = 4
    # None: training's (set both when sweeping training.seq_len or the batch size, so that every
    # job of the sweep evaluates the same tokens).
    local_batch_size: Optional[int] = None
    seq_len: Optional[int] = None


@dataclass
class WandbConfig:
    """Weights & Biases run settings (``qwen3_trn.tracking``); logged from the metrics rank only."""

    project: str = "qwen3_trn"
    entity: Optional[str] = None
    # offline: no key or network, a run-<id>.wandb file in <run dir>/wandb (upload later with
    # `wandb sync`); online: needs WANDB_API_KEY or `wandb login`; disabled: no wandb at all.
    mode: str = "offline"
    # None: the sweep's group in a multirun (shared by all its jobs), no group for a single run.
    group: Optional[str] = None
    # None: the training mode (backend name).
    job_type: Optional[str] = None
    # None: run_name, else the job's overrides (e.g. "backend=native,model.top_k=2").
    name: Optional[str] = None
    # Extra tags; the mode, device and "sweep" (in a multirun) are always added.
    tags: list[str] = field(default_factory=list)
    # None: the run directory (wandb writes <dir>/wandb/offline-run-*/).
    dir: Optional[str] = None


@dataclass
class LoggerConfig:
    # Any of: wandb, tensorboard. Empty logs only to metrics.jsonl and the console.
    backends: list[str] = field(default_factory=list)
    log_freq: int = 1
    all_ranks_to_console: bool = False
    wandb: WandbConfig = field(default_factory=WandbConfig)


@dataclass
class LauncherConfig:
    """How ranks are started (a key of ``qwen3_trn.launch.LAUNCHERS``)."""

    name: str = "local"
    nnodes: int = 1
    nproc_per_node: int = 1
    node_rank: int = 0
    rdzv_backend: str = "c10d"
    # host:port of the rendezvous; None picks localhost with a free port (single node).
    rdzv_endpoint: Optional[str] = None
    rdzv_id: Optional[str] = None
    max_restarts: int = 0
    env: dict[str, str] = field(default_factory=dict)
    # Device packing for concurrent jobs on one machine: each job claims this many devices
    # (GPUs, NeuronCores or CPU cores) exclusively and waits while too few are free. 0: off.
    devices_per_job: int = 0
    # --- launcher=slurm (qwen3_trn.launch.slurm; conf/launcher/slurm.yaml) ---
    # Number of nodes, the user-facing name of nnodes: when set it sets nnodes (wins over a preset's).
    nodes: Optional[int] = None
    # Slurm partition (None: the cluster's default); checked against `sinfo` before submitting.
    partition: Optional[str] = None
    # Time limit in Slurm's format: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS.
    time: str = "60"
    cpus_per_task: Optional[int] = None
    gpus_per_node: Optional[int] = None
    mem_gb: Optional[float] = None
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
    signal_delay_s: int = 120
    # How many times a job may be requeued after hitting its time limit.
    max_requeues: int = 3
    # Python on the nodes (None: this interpreter, which must be reachable there).
    python: Optional[str] = None


@dataclass
class DeviceConfig:
    type: str = "auto"


@dataclass
class RunConfig:
    """The whole composed configuration of one job."""

    backend: BackendConfig = field(default_factory=BackendConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    parallelism: ParallelismConfig = field(default_factory=ParallelismConfig)
    compile: CompileConfig = field(default_factory=CompileConfig)
    data: DataConfig = field(default_factory=DataConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    validation: ValidationConfig = field(default_factory=ValidationConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    launcher: LauncherConfig = field(default_factory=LauncherConfig)
    device: DeviceConfig = field(default_factory=DeviceConfig)
    # Escape hatch: any torchtitan Trainer.Config field by its dotted path,
    # e.g. ``+titan.comm.init_timeout_seconds=600``. Checked against the real dataclass.
    titan: dict[str, Any] = field(default_factory=dict)
    # plan: print what would run (config, world layout, torchrun line, Trainer.Config); train: run it.
    mode: str = "train"
    run_name: Optional[str] = None
    output_dir: str = MISSING
