"""``launcher=local``: ranks on this machine (``node.start_node_ranks``: in-process for one
rank, PyTorch's elastic launcher otherwise)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from qwen3_trn.common.errors import ConfigError
from qwen3_trn.config.option_schemas import LocalLauncherConfig
from qwen3_trn.config.schema import Mode, RunConfig
from qwen3_trn.devices import resolve_device
from qwen3_trn.launch.base import LaunchDescription, Launcher
from qwen3_trn.launch.node import start_node_ranks, torchrun_command
from qwen3_trn.results.records import CONFIG_FILE, RunStatus, settle_died
from qwen3_trn.run.layout import Layout
from qwen3_trn.run.preflight import Prepared
from qwen3_trn.run.worker import WorkerJob
from qwen3_trn.titan import Trainer


class LocalLauncher(Launcher):
    Config = LocalLauncherConfig

    config: Config

    def validate(self, cfg: RunConfig, layout: Layout) -> None:
        packed = self.config.devices_per_job
        if cfg.mode != Mode.train or not packed or layout.nproc_per_node <= packed:
            return
        device = resolve_device(cfg.device.type)
        if device.visible_devices_env:  # a GPU or NeuronCore per rank (CPU ranks share their cores)
            raise ConfigError(
                "launcher.nproc_per_node",
                f"{layout.nproc_per_node} ranks per node cannot each have a {device.type} device of their own in a packed "
                f"job's {packed} (launcher.devices_per_job={packed}); use launcher.nproc_per_node={packed} (or -1: one rank "
                f"per packed device), or launcher.devices_per_job={layout.nproc_per_node}.",
            )

    def describe(self, prepared: Prepared, run_dir: Path) -> LaunchDescription:
        command = torchrun_command(self.config, prepared.layout, run_dir / CONFIG_FILE, str(self.config.rdzv_backend))
        return LaunchDescription(where=f"this machine (launcher={self.name})", torchrun=command, submission=command)

    def launch(self, prepared: Prepared, trainer_config: Trainer.Config | None = None, *, detach: bool = False) -> RunStatus:
        job = WorkerJob(cfg=prepared.cfg, device_type=prepared.device.type, layout=prepared.layout, backend=prepared.backend)
        start_node_ranks(job, trainer_config, self.config.rdzv_backend, self.config.devices_per_job)
        return RunStatus.completed

    @classmethod
    def refresh(cls, run_dirs: list[Path], wait: bool = False) -> list[dict[str, Any]]:
        """The runs' summaries; one still recorded running whose launching process is gone
        (killed hard: its ranks die with it, ``worker.die_with_launcher``) settled as died.
        Nothing to wait for: a run started here ends with the command that started it."""
        out = []
        for run_dir in map(Path, run_dirs):
            summary = settle_died(run_dir)
            if summary:
                out.append({**summary, "run_dir": summary.get("run_dir") or str(run_dir)})
        return out


__all__ = ["LocalLauncher"]
