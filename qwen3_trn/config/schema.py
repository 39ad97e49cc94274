"""Typed schema of every config group.

Each group is a dataclass registered in Hydra's ConfigStore (``store``); the ``backend``,
``launcher`` and ``data`` groups have their base here and one Config per option in
``option_schemas``. A key's range, path kind and hint are on its field (``keys.key``). The YAML
under ``conf/`` only chooses values and never restates a default.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any, ClassVar, Optional

from omegaconf import MISSING

from qwen3_trn.config.keys import PathKind, key
from qwen3_trn.config.options import OptionConfig


class Choice(str, Enum):
    """A config choice: compares equal to, prints as and serialises as its value."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


class Mode(Choice):
    train = "train"
    plan = "plan"
    check = "check"


class DeviceType(Choice):
    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"
    neuron = "neuron"


class Attention(Choice):
    auto = "auto"
    sdpa = "sdpa"
    flex = "flex"
    flex_flash = "flex_flash"
    varlen = "varlen"


class DType(Choice):
    float32 = "float32"
    bfloat16 = "bfloat16"


class ParamDType(Choice):
    auto = "auto"
    float32 = "float32"
    bfloat16 = "bfloat16"


class ActivationCheckpoint(Choice):
    none = "none"
    selective = "selective"
    full = "full"


class CompileBackend(Choice):
    off = "off"
    inductor = "inductor"
    aot_eager = "aot_eager"
    neuron = "neuron"


class CompileComponent(Choice):
    model = "model"
    loss = "loss"
    grad_clip = "grad_clip"


class ReshardAfterForward(Choice):
    default = "default"
    always = "always"
    never = "never"


class OptimizerName(Choice):
    AdamW = "AdamW"
    Adam = "Adam"


class DecayType(Choice):
    linear = "linear"
    sqrt = "sqrt"
    cosine = "cosine"


class LoggerBackend(Choice):
    wandb = "wandb"
    tensorboard = "tensorboard"


class WandbMode(Choice):
    offline = "offline"
    online = "online"
    disabled = "disabled"


class RendezvousBackend(Choice):
    c10d = "c10d"
    static = "static"
    etcd = "etcd"


@dataclass
class BackendConfig(OptionConfig):
    """Which training mode builds the model (``backend=<name>``; ``qwen3_trn.backends``)."""

    group: ClassVar[str] = "backend"
    name: str = "native"


@dataclass
class ModelConfig:
    """A torchtitan Qwen3 flavor plus architecture overrides (None keeps the flavor's value)."""

    # the model group sets it (model=<flavor or preset>)
    flavor: str = key(MISSING, hint="model=<preset> chooses it (e.g. model=tiny)")
    n_layers: Optional[int] = key(None, ge=1)
    dim: Optional[int] = key(None, ge=1)
    n_heads: Optional[int] = key(None, ge=1)
    n_kv_heads: Optional[int] = key(None, ge=1)
    head_dim: Optional[int] = key(None, ge=1)
    hidden_dim: Optional[int] = key(None, ge=1)
    vocab_size: Optional[int] = key(None, ge=1)
    max_seq_len: Optional[int] = key(None, ge=1)
    rope_theta: Optional[float] = key(None, gt=0)
    num_experts: Optional[int] = key(None, ge=1)
    top_k: Optional[int] = key(None, ge=1)
    moe_hidden_dim: Optional[int] = key(None, ge=1)
    # input embedding shared with the output projection (HF tie_word_embeddings)
    tie_embeddings: Optional[bool] = None
    # one wqkv projection instead of wq/wk/wv (native layout only; HF keeps them separate)
    fuse_qkv: Optional[bool] = None
    # auto: sdpa on CPU and Neuron, flex on CUDA
    attention: Attention = Attention.auto
    # Tokenizer / HF assets directory; None uses the tokenizer the project ships.
    hf_assets_path: Optional[str] = key(
        None, path=PathKind.read, hint="point it at a folder holding tokenizer.json (HF assets), or leave it unset"
    )
    # Hub id or local directory holding config.json (backend=hf_v5).
    hf_model: Optional[str] = key(None, path=PathKind.local_or_hub_id)


@dataclass
class ParallelismConfig:
    """Parallel degrees; ``-1`` means "whatever is left of the world size"."""

    dp_replicate: int = key(1, ge=1, allow=(-1,), note="-1: whatever is left of the world size")
    dp_shard: int = key(-1, ge=1, allow=(-1,), note="-1: whatever is left of the world size")
    tp: int = key(1, ge=1, allow=(-1,), note="-1: whatever is left of the world size")
    pp: int = key(1, ge=1, allow=(-1,), note="-1: whatever is left of the world size")
    cp: int = key(1, ge=1, allow=(-1,), note="-1: whatever is left of the world size")
    ep: int = key(1, ge=1)
    pp_schedule: str = "1F1B"
    pp_microbatch_size: int = key(1, ge=1)
    fsdp_reshard_after_forward: ReshardAfterForward = ReshardAfterForward.default
    # true: choose the degrees above for the ranks given (FSDP first, then TP/EP/PP as the
    # model needs) so that a step fits the device's memory (qwen3_trn.run.fit.solver).
    auto: bool = False


@dataclass
class CompileConfig:
    """torch.compile: backend ``off`` disables it."""

    backend: CompileBackend = CompileBackend.off
    components: list[CompileComponent] = field(default_factory=lambda: [CompileComponent.model, CompileComponent.loss])


@dataclass
class DataConfig(OptionConfig):
    """Where training text comes from (``data=<name>``; ``qwen3_trn.data.sources``)."""

    group: ClassVar[str] = "data"
    name: str = "embedded"
    num_workers: int = key(0, ge=0)


@dataclass
class TrainingConfig:
    steps: int = key(40, ge=1)
    local_batch_size: int = key(2, ge=1)
    global_batch_size: int = key(-1, ge=1, allow=(-1,), note="-1: local_batch_size x the data-parallel degree")
    seq_len: int = key(256, ge=1)
    dtype: DType = DType.float32
    # auto: bf16 where the device computes it natively (GPU, Trainium, AMX CPUs), else fp32.
    mixed_precision_param: ParamDType = ParamDType.auto
    max_norm: float = key(1.0, gt=0)
    seed: int = key(42, ge=0)
    deterministic: bool = False
    gc_freq: int = key(50, ge=1)
    activation_checkpoint: ActivationCheckpoint = ActivationCheckpoint.none


@dataclass
class OptimizerConfig:
    name: OptimizerName = OptimizerName.AdamW
    lr: float = key(3.0e-3, ge=0, note="0 keeps the weights as loaded")
    weight_decay: float = key(0.1, ge=0)
    beta1: float = key(0.9, ge=0, lt=1)
    beta2: float = key(0.95, ge=0, lt=1)
    eps: float = key(1.0e-8, gt=0)
    # None: a tenth of training.steps, at most 200 (torchtitan's own default), so that the
    # default fits a run of any length; a number given is refused when it exceeds the run.
    warmup_steps: Optional[int] = key(None, ge=0, le="training.steps", note="warm-up is part of training.steps")
    decay_ratio: Optional[float] = key(None, ge=0, le=1)
    decay_type: DecayType = DecayType.linear
    min_lr_factor: float = key(0.0, ge=0, le=1)


# The warm-up a run gets when optimizer.warmup_steps is not set: a share of the run, capped.
AUTO_WARMUP_SHARE = 0.1
AUTO_WARMUP_CAP = 200


def warmup_steps(optimizer: OptimizerConfig, training_steps: int) -> int:
    """The warm-up steps a run uses: the configured number, or a share of the run, capped."""
    if optimizer.warmup_steps is not None:
        return optimizer.warmup_steps
    return min(int(training_steps * AUTO_WARMUP_SHARE), AUTO_WARMUP_CAP)


@dataclass
class CheckpointConfig:
    enable: bool = False
    interval: int = key(500, ge=1)
    folder: str = "checkpoint"
    keep_latest_k: int = key(3, ge=0, exclude=(1,), note="0 keeps all; torchtitan keeps at least 2, as the newest may be mid-save")
    # A previous run directory (or one of its step-N checkpoint folders) to resume from.
    resume_from: Optional[str] = key(
        None, path=PathKind.read, hint="pass a run directory that was trained with checkpoint=on, or one of its step-N folders"
    )
    load_step: int = key(-1, ge=0, allow=(-1,), note="-1: the latest")
    # Weights to start from (DCP folder, or HF safetensors folder with initial_load_in_hf).
    initial_load_path: Optional[str] = key(
        None, path=PathKind.read_unless_url, hint="pass a DCP checkpoint folder (step-N) or a folder of HF safetensors"
    )
    initial_load_in_hf: bool = False
    # Hugging Face model folders <run dir>/<hf_folder>/step-N (config.json, tokenizer, generation
    # config, safetensors in export_dtype) at the last step, and every hf_interval steps if > 0.
    hf_export: bool = False
    hf_interval: int = key(0, ge=0, note="0: export at the last step only")
    hf_folder: str = "hf"
    export_dtype: DType = DType.float32


@dataclass
class ValidationConfig:
    """Held-out loss through torchtitan's Validator: after step 1, every ``interval`` steps and at
    the last step, on the same tokens each time."""

    enable: bool = True
    interval: int = key(10, ge=1, note="validate every n steps; or validation=off")
    # Batches per validation; -1: the whole held-out split.
    steps: int = key(4, ge=1, allow=(-1,), note="-1: the whole held-out split")
    # None: training's (set both when sweeping training.seq_len or the batch size, so that every
    # job of the sweep evaluates the same tokens).
    local_batch_size: Optional[int] = key(None, ge=1)
    seq_len: Optional[int] = key(None, ge=1)


@dataclass
class WandbConfig:
    """Weights & Biases run settings (``qwen3_trn.run.tracking``); logged from the metrics rank only."""

    project: str = "qwen3_trn"
    entity: Optional[str] = None
    # offline: no key or network, a run-<id>.wandb file in <run dir>/wandb (upload later with
    # `wandb sync`); online: needs WANDB_API_KEY or `wandb login`; disabled: no wandb at all.
    mode: WandbMode = WandbMode.offline
    # None: the sweep's group in a multirun (shared by all its jobs), no group for a single run.
    group: Optional[str] = None
    # None: the training mode (backend name).
    job_type: Optional[str] = None
    # None: run_name, else the job's overrides (e.g. "backend=native,model.top_k=2").
    name: Optional[str] = None
    # Extra tags; the mode, device and "sweep" (in a multirun) are always added.
    tags: list[str] = field(default_factory=list)
    # None: the run directory (wandb writes <dir>/wandb/offline-run-*/).
    dir: Optional[str] = key(None, path=PathKind.written)


@dataclass
class LoggerConfig:
    # Any of: wandb, tensorboard. Empty logs only to metrics.jsonl and the console.
    backends: list[LoggerBackend] = field(default_factory=list)
    log_freq: int = key(1, ge=1)
    all_ranks_to_console: bool = False
    wandb: WandbConfig = field(default_factory=WandbConfig)


@dataclass
class LauncherConfig(OptionConfig):
    """How ranks are started (``launcher=<name>``; ``qwen3_trn.launch``); every launcher starts a
    node's ranks with torch's elastic launcher."""

    group: ClassVar[str] = "launcher"
    name: str = "local"
    nnodes: int = key(1, ge=1)
    # -1: one rank per device present (or per packed device, launcher.devices_per_job).
    nproc_per_node: int = key(1, ge=1, allow=(-1,), note="-1: one rank per device")
    # host:port of the c10d rendezvous; None: a free local port (one node), or the job's first
    # node (Slurm).
    rdzv_endpoint: Optional[str] = None
    rdzv_id: Optional[str] = None
    max_restarts: int = key(0, ge=0)
    # Environment of every rank (e.g. NEURON_LOGICAL_NC_CONFIG); secret-looking values are
    # passed on but never written to a file.
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class DeviceConfig:
    # auto: neuron if torch-neuronx imports, else cuda, else cpu.
    type: DeviceType = DeviceType.auto
    # Memory one device offers, in GiB (None: the device's own figure, host RAM available on
    # CPU, or the accelerator table for a device that is not on this machine).
    memory_gib: Optional[float] = key(None, gt=0)
    # Which accelerator a planned run targets, a key of qwen3_trn.run.fit.device_memory.ACCELERATORS
    # (trn2, trn2-lnc1, trn1, h100, h200, a100-40gb, a100-80gb, ...); None: trn2 / h100.
    accelerator: Optional[str] = None


@dataclass
class FitConfig:
    """The memory fit check before any worker starts (qwen3_trn.run.fit)."""

    # false: start training even when the estimate exceeds a rank's memory.
    check: bool = True


@dataclass
class TrialConfig:
    """The Optuna trial of a search's job, set by the search sweeper (null outside a search); its
    pruner may stop the run (status ``pruned``)."""

    # the study's storage: a URL (sqlite:///<sweep dir>/optuna.db; a database server's without its
    # password, which comes in the environment: qwen3_trn.run.trials) or a journal file's path
    storage: Optional[str] = None
    study: Optional[str] = None
    # None: the running trial whose user attribute run_dir is this run's directory
    number: Optional[int] = key(None, ge=0)


@dataclass
class SweepConfig:
    """How a multirun treats its jobs (``qwen3_trn.sweeps.sweeper``)."""

    # false: one invalid job stops the sweep before any job starts; true: the valid jobs run and
    # the invalid ones are recorded as skipped.
    skip_invalid: bool = False
    # Replicates: every job of the sweep runs this many times, with training.seed, training.seed+1,
    # ... (each seed its own model init and data order); the report shows their mean and spread.
    seeds: int = key(1, ge=1, note="how many seeds each job of a sweep runs with")
    trial: TrialConfig = field(default_factory=TrialConfig)


@dataclass
class RunConfig:
    """One job's whole configuration. ``backend``, ``data`` and ``launcher`` default to their
    group's default option, as ``conf/config.yaml`` chooses."""

    backend: BackendConfig = field(default_factory=BackendConfig.default)
    model: ModelConfig = field(default_factory=ModelConfig)
    parallelism: ParallelismConfig = field(default_factory=ParallelismConfig)
    compile: CompileConfig = field(default_factory=CompileConfig)
    data: DataConfig = field(default_factory=DataConfig.default)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    validation: ValidationConfig = field(default_factory=ValidationConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    launcher: LauncherConfig = field(default_factory=LauncherConfig.default)
    device: DeviceConfig = field(default_factory=DeviceConfig)
    fit: FitConfig = field(default_factory=FitConfig)
    sweep: SweepConfig = field(default_factory=SweepConfig)
    # Escape hatch: any torchtitan Trainer.Config field by its dotted path,
    # e.g. ``+titan.comm.init_timeout_seconds=600``. Checked against the real dataclass.
    titan: dict[str, Any] = field(default_factory=dict)
    # train: run it; plan: print what would run (config, world layout, torchrun line,
    # Trainer.Config); check: plan, and build rank 0 on torchtitan's fake backend.
    mode: Mode = Mode.train
    run_name: Optional[str] = None
    # The run directory: Hydra's (hydra.run.dir); null only where Hydra prints the config (--cfg).
    output_dir: Optional[str] = MISSING


def option_groups() -> dict[str, type[OptionConfig]]:
    """The groups with a schema per option, by group: their base configs."""
    hints = typing.get_type_hints(RunConfig)
    return {f.name: hints[f.name] for f in fields(RunConfig) if isinstance(hints[f.name], type) and issubclass(hints[f.name], OptionConfig)}
