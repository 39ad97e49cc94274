"""wandb tracking: what a run records (offline, no key or network), from one rank only, and the
other logger choices."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from qwen3_trn.app import to_run_config
from qwen3_trn.results.records import read_manifest, read_metrics
from qwen3_trn.run.tracking import plan_tracking
from tests.commands import command_in_process
from tests.conftest import command_in_process, compose_config, offline_wandb_files

REPO = Path(__file__).resolve().parents[1]


def _plan(overrides: list[str], tmp_path: Path, sweep: dict | None = None, cli: list[str] | None = None) -> dict:
    cfg = to_run_config(compose_config(overrides, tmp_path))
    return plan_tracking(cfg, tmp_path, cli if cli is not None else overrides, sweep, {"device": "cpu", "world_size": 1})


def test_default_logger_is_offline_wandb(tmp_path):
    cfg = to_run_config(compose_config([], tmp_path))
    assert cfg.logger.backends == ["wandb"] and cfg.logger.wandb.mode == "offline"
    for choice, backends in (("none", []), ("tensorboard", ["tensorboard"])):
        assert to_run_config(compose_config([f"logger={choice}"], tmp_path)).logger.backends == backends


def test_single_run_plan(tmp_path):
    plan = _plan(["model=tiny_moe", "logger.wandb.tags=[ablation,v2]"], tmp_path, cli=["model=tiny_moe"])
    w = plan["wandb"]
    assert plan["enabled"] and w["mode"] == "offline" and w["dir"] == str(tmp_path)
    assert w["group"] is None and w["job_type"] == "native" and w["name"] == "model=tiny_moe"
    assert w["tags"] == ["native", "cpu", "ablation", "v2"]
    assert re.fullmatch(r"[a-z0-9]{8}", w["id"])
    assert plan["run"]["mode"] == "native" and plan["run"]["kernel"] and plan["run"]["device"] == "cpu"
    assert plan["run"]["params"] == {"model": "tiny_moe"}
    assert re.fullmatch(r"[0-9a-f]{40}|unknown", plan["git_revision"])
    assert not _plan(["logger=none"], tmp_path)["enabled"]
    assert not _plan(["logger.wandb.mode=disabled"], tmp_path)["enabled"]


def test_sweep_job_plan(tmp_path):
    sweep = {"group": "moe_grid-20260101-000000-abcd", "name": "model.top_k=2", "experiment": "moe_grid", "num": 3, "dir": "/s"}
    plan = _plan(["model=tiny_moe", "model.top_k=2"], tmp_path, sweep)
    w = plan["wandb"]
    assert (w["group"], w["name"], w["job_type"]) == ("moe_grid-20260101-000000-abcd", "model.top_k=2", "native")
    assert w["tags"] == ["native", "cpu", "sweep", "moe_grid"]
    assert plan["run"]["job_num"] == 3 and plan["run"]["sweep_group"] == sweep["group"]
    # an explicit group, job type and name win over the sweep's
    plan = _plan(["logger.wandb.group=mine", "logger.wandb.job_type=ablation", "logger.wandb.name=x"], tmp_path, sweep)
    assert (plan["wandb"]["group"], plan["wandb"]["job_type"], plan["wandb"]["name"]) == ("mine", "ablation", "x")


def test_only_the_metrics_rank_starts_wandb(tmp_path, monkeypatch):
    """The project's wandb run replaces torchtitan's WandBLogger and starts on the metrics rank
    only (rank 0; the first rank of the last stage with pipeline parallelism)."""
    import torch.distributed as dist
    from torchtitan.components.metrics import WandBLogger

    from qwen3_trn.run import metrics

    started = []

    class FakeRun:
        def log(self, *args):
            pass

        def close(self):
            pass

    monkeypatch.setattr(metrics, "start_wandb", lambda run_dir, info: started.append(run_dir.name) or FakeRun())
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    layouts = {
        "dp2": SimpleNamespace(pp_enabled=False, dp_replicate=1, dp_shard=2, world_size=2, pp=1),
        "pp2": SimpleNamespace(pp_enabled=True, dp_replicate=1, dp_shard=2, world_size=4, pp=2),
    }
    for layout, ranks in (("dp2", range(2)), ("pp2", range(4))):
        for rank in ranks:
            monkeypatch.setattr(dist, "get_rank", lambda rank=rank: rank)
            processor = object.__new__(metrics.RunMetricsProcessor)
            processor._jsonl = processor._wandb = None
            config = metrics.RunMetricsProcessor.Config(
                enable_wandb=True, run_dir=str(tmp_path / f"{layout}-rank{rank}"), console_progress=False
            )
            built = processor._build_metric_logger(
                config=config, parallel_dims=layouts[layout], dump_folder=str(tmp_path), pp_schedule="1F1B"
            )
            assert not any(isinstance(child, WandBLogger) for child in getattr(built, "_loggers", []))
            if processor._jsonl is not None:
                processor._jsonl.close()
    assert started == ["dp2-rank0", "pp2-rank2"]


@pytest.mark.slow
def test_other_loggers_and_no_wandb(tmp_path):
    """A multirun over the other logger choices (wandb, the default, is covered by test_sweep.py):
    tensorboard writes its event file and no wandb run; none neither. The report works from the
    metrics files alone."""
    sweep_dir = tmp_path / "loggers"
    args = [
        "-m",
        "debug=smoke",
        "logger=tensorboard,none",
        "training.steps=2",
        f"hydra.sweep.dir={sweep_dir}",
    ]
    result = command_in_process(args)
    assert result.returncode == 0, f"stdout:\n{result.stdout[-3000:]}\nstderr:\n{result.stderr[-3000:]}"
    manifest = read_manifest(sweep_dir)
    assert manifest["counts"]["completed"] == 2
    jobs = {next(o.split("=")[1] for o in job["overrides"] if o.startswith("logger=")): job for job in manifest["jobs"]}
    for choice, job in jobs.items():
        run_dir = Path(job["run_dir"])
        assert [r["step"] for r in read_metrics(run_dir)] == [1, 2]
        wandb_files = offline_wandb_files(run_dir)
        tb_events = list(run_dir.glob("tb/*/events.out.tfevents.*"))
        assert not wandb_files and not (run_dir / "wandb").exists() and "wandb_run_id" not in job
        assert bool(tb_events) == (choice == "tensorboard")
    html = (sweep_dir / "report.html").read_text()
    assert html.count("<tr data-run=") == 2
