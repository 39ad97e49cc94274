"""Every check that can fail before a worker starts, and the objects a run needs.

``prepare`` raises all of a command's problems together (``errors.ConfigErrors``) before anything
is written or started; launcher-specific checks are the launcher's own, run here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from qwen3_trn.backends import Backend, build_backend
from qwen3_trn.checkpointing import ResumePoint
from qwen3_trn.cli.early import first_checks
from qwen3_trn.common.errors import ConfigError, Problems
from qwen3_trn.config.schema import Mode, RunConfig
from qwen3_trn.devices import DEVICES, PACKING_RULES, SHARED_RANK_ENV, DeviceSpec, planned_device, probe_device, resolve_device
from qwen3_trn.hf.export import check_hf_export
from qwen3_trn.models.architecture import Qwen3Architecture
from qwen3_trn.run import fit
from qwen3_trn.run.convert import resume_checkpoint, to_trainer_config
from qwen3_trn.run.inputs import check_data, check_tokenizer
from qwen3_trn.run.layout import Layout, resolve_layout
from qwen3_trn.run.validation import check_validation
from qwen3_trn.titan import EXPERT_PARALLEL, PIPELINE_STAGES, Trainer

# A launcher's own checks of a config and its layout (``Launcher.validate``): raise ConfigError.
LauncherCheck = Callable[[RunConfig, Layout], None]


@dataclass
class Resolved:
    """The device, layout and architecture, and this process's one ``Backend``, used by everything
    after preflight."""

    cfg: RunConfig
    device: DeviceSpec
    layout: Layout
    arch: Qwen3Architecture
    backend: Backend
    # Why parallelism=auto chose the layout (None: the config gave it).
    layout_choice: str | None = field(default=None, kw_only=True)


@dataclass
class Prepared(Resolved):
    trainer_config: Trainer.Config
    # The checkpoint the run resumes from (checkpoint.resume_from), None for a fresh run.
    resume: ResumePoint | None = field(default=None, kw_only=True)
    # Rank 0's memory and the model's counts against the device (qwen3_trn.run.fit).
    fit: fit.FitReport | None = field(default=None, kw_only=True)


def _device(cfg: RunConfig, ranks_here: bool) -> DeviceSpec:
    requested = cfg.device.type
    plans_elsewhere = cfg.mode != Mode.train or not ranks_here
    if plans_elsewhere and requested in DEVICES and isinstance(probe_device(requested), str):
        return planned_device(requested)  # planning for a machine that is not this one
    return resolve_device(requested)


def _devices_per_job(cfg: RunConfig) -> int:
    return getattr(cfg.launcher, "devices_per_job", 0)


def _nproc_per_node(cfg: RunConfig, device: DeviceSpec, ranks_here: bool) -> int:
    nproc = cfg.launcher.nproc_per_node
    packed = _devices_per_job(cfg)
    if packed < 0 or (cfg.mode == Mode.train and packed > device.count):
        raise ConfigError(
            "launcher.devices_per_job",
            f"{packed} device(s) per job cannot be packed onto this machine's {device.count} {device.type} device(s); "
            f"use 1..{device.count}, or 0 to turn packing off.",
        )
    if packed and device.type in PACKING_RULES:
        refusal = PACKING_RULES[device.type](packed, packed if nproc == -1 else nproc)
        if refusal is not None:
            raise ConfigError("launcher.devices_per_job", f"{refusal}.")
    if nproc == -1 and packed:
        return packed
    if nproc == -1:
        if device.count == 0 and device.type in fit.PLANNED_NODES:
            return fit.planned_ranks_per_node(cfg, device)  # a node of the accelerator planned for
        if device.count == 0:
            raise ConfigError(
                "launcher.nproc_per_node",
                f"-1 means one rank per {device.type} device, but none is present to count; give the number explicitly.",
            )
        return device.count
    if cfg.mode == Mode.train and ranks_here and nproc > device.count:
        raise ConfigError(
            "launcher.nproc_per_node",
            f"{nproc} ranks were asked for, but this machine has {device.count} {device.type} "
            f"device(s); use launcher.nproc_per_node<={device.count} (or -1 for one per device).",
        )
    return nproc


def _check_training(cfg: RunConfig, arch: Qwen3Architecture, layout: Layout) -> None:
    training = cfg.training
    if training.seq_len > arch.max_seq_len:
        raise ConfigError(
            "training.seq_len",
            f"{training.seq_len} is above the model's max_seq_len {arch.max_seq_len}; lower training.seq_len or raise model.max_seq_len.",
        )
    per_step = training.local_batch_size * layout.data_parallel
    if training.global_batch_size > 0 and training.global_batch_size % per_step:
        raise ConfigError(
            "training.global_batch_size",
            f"{training.global_batch_size} is not a multiple of local_batch_size x data-parallel degree = {per_step}.",
        )


def _check_compile(cfg: RunConfig, device: DeviceSpec) -> None:
    if cfg.compile.backend == "neuron" and device.type != "neuron":
        raise ConfigError(
            "compile.backend",
            f"compile=neuron needs torch-neuronx's 'neuron' compiler backend, but the device is {device.type}; "
            "use compile=inductor or compile=off here, or plan a Trainium run with device=neuron mode=plan.",
        )


def _check_torchtitan_features(layout: Layout) -> None:
    """Degrees the installed torchtitan cannot run (``qwen3_trn.titan``)."""
    for degree, feature in ((layout.pp, PIPELINE_STAGES), (layout.ep, EXPERT_PARALLEL)):
        if degree > 1 and not feature.available:
            raise feature.refusal()


def resolve(
    cfg: RunConfig, ranks_here: bool = True, problems: Problems | None = None, check_launcher: LauncherCheck | None = None
) -> Resolved:
    """The run's device, layout and architecture, checked. With ``ranks_here`` False (ranks on
    other machines) the device is planned for, not probed.

    Checks that need a resolved device, layout or model run once those are known. Given
    ``problems``, the last checks' findings are left there for the caller to raise."""
    owned = problems is None
    problems = problems or Problems()
    found_before = len(problems.found)
    backend = build_backend(cfg.backend)
    device = layout = arch = None
    with problems.check():
        device = _device(cfg, ranks_here)
    with problems.check():
        arch = backend.architecture(cfg)
    with problems.check():
        check_hf_export(cfg.checkpoint)
    if device is not None:
        with problems.check():
            _check_compile(cfg, device)
        with problems.check():
            layout = resolve_layout(cfg.parallelism, cfg.launcher.nnodes, _nproc_per_node(cfg, device, ranks_here))
            if not cfg.parallelism.auto:
                fit.check_vendor_layout(cfg, device, layout)
        if arch is not None:
            with problems.check():
                backend.validate(cfg, arch, device)
                backend.settle(device)
    if layout is not None and check_launcher is not None:
        with problems.check():
            check_launcher(cfg, layout)
    if len(problems.found) > found_before:  # what follows sizes the layout for this model on this device
        problems.stop_if_any()
    choice = None
    if cfg.parallelism.auto:  # the degrees that fit, written into the config every rank starts from
        layout, choice = fit.auto_layout(
            cfg, device, arch, to_trainer_config(cfg, device, layout, backend), layout.nnodes, layout.nproc_per_node
        )
        cfg.parallelism = fit.chosen_parallelism(cfg.parallelism, layout)
    with problems.check():
        _check_torchtitan_features(layout)
    with problems.check():
        backend.validate_sharded(cfg, arch, device, layout)
    with problems.check():
        _check_training(cfg, arch, layout)
    with problems.check():
        check_validation(cfg.validation, cfg.training.seq_len, arch.max_seq_len, pipeline_parallel=layout.pp > 1)
    if owned:
        problems.stop_if_any()
    return Resolved(cfg=cfg, device=device, layout=layout, arch=arch, backend=backend, layout_choice=choice)


def _trainer_config(resolved: Resolved) -> Trainer.Config:
    try:
        return to_trainer_config(resolved.cfg, resolved.device, resolved.layout, resolved.backend)
    except ConfigError:
        raise
    except (ValueError, AssertionError) as exc:
        raise ConfigError("titan", f"torchtitan refused the resulting Trainer.Config: {exc}") from exc


def prepare(
    cfg: RunConfig, ranks_here: bool = True, check_launcher: LauncherCheck | None = None, shared_dir: str | None = None
) -> Prepared:
    """``resolve``, the run's inputs and the exact ``Trainer.Config`` the ranks will build.

    Ranges and paths are checked first (``early.first_checks``); a value out of range stops there.
    The data, checkpoint, layout, tokenizer and fit checks follow, each where its inputs resolved.
    ``shared_dir``: the directory a sweep's jobs share for device caches (None: the run's own)."""
    problems = Problems()
    if not first_checks(cfg, problems):
        problems.stop_if_any()
    problems.settled.update(problem.key for problem in problems.found)  # paths that do not exist
    with problems.check():
        check_data(cfg)
    resume = None
    with problems.check():
        resume = resume_checkpoint(cfg.checkpoint)
    resolved = resolve(cfg, ranks_here, problems, check_launcher)
    if resolved.device.type in SHARED_RANK_ENV:  # a value the user gave is kept
        shared = SHARED_RANK_ENV[resolved.device.type](Path(shared_dir or cfg.output_dir))
        cfg.launcher.env = {**shared, **cfg.launcher.env}
    trainer_config = None
    with problems.check():
        trainer_config = _trainer_config(resolved)
    if trainer_config is not None:
        with problems.check():
            check_tokenizer(
                trainer_config.hf_assets_path, lambda path: trainer_config.tokenizer.build(tokenizer_path=path), resolved.arch.vocab_size
            )
    problems.stop_if_any()  # the fit check sizes a valid config
    report = fit.preflight(cfg, resolved.device, resolved.layout, resolved.arch, trainer_config, resolved.layout_choice)
    trainer_config.metrics.run_info["fit"] = report.to_record()
    return Prepared(**vars(resolved), trainer_config=trainer_config, resume=resume, fit=report)
