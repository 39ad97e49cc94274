"""``python -m qwen3_trn.rank <run dir>/config.yaml``: one rank from a saved, resolved config.

What ``mode=plan``'s torchrun line and external launchers run on each node; it never composes.
``--check`` sizes rank 0 of the layout on one CPU with fake collectives and fake tensors.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys

from qwen3_trn.cli.exits import imports_of_entry_point

# A torchtitan that lacks what the package uses: exit 2 as the command (qwen3_trn.cli.exits).
with imports_of_entry_point(__name__):
    from qwen3_trn.common.errors import ConfigError
    from qwen3_trn.config.schema import Mode, RunConfig
    from qwen3_trn.groups import load_run_config
    from qwen3_trn.run.fit.device_memory import margin_bytes
    from qwen3_trn.run.fit.tracked import isolated, rank0_parameters, tracked_estimate, untrackable
    from qwen3_trn.run.preflight import resolve
    from qwen3_trn.run.worker import WorkerJob, run_worker


def check_layout(cfg: RunConfig) -> dict:
    """Build rank 0's Trainer of the planned world on fake collectives and fake tensors, and measure
    its step with PyTorch's memory tracker (``fit.tracked``), each build in a child process."""
    cfg.mode = Mode.check
    resolved = resolve(cfg)
    layout = resolved.layout
    params, local = isolated(rank0_parameters, cfg, layout)
    result = {"world_size": layout.world_size, "parameters": params, "rank0_local_parameters": local, "layout": layout.describe()}
    reason = untrackable(layout)
    if reason is not None:
        result["tracked_error"] = reason
        return result
    try:
        margin = functools.partial(margin_bytes, resolved.device.type)
        result["tracked"] = tracked_estimate(cfg, layout, resolved.backend, resolved.arch.n_layers, margin).to_record()
    except Exception as exc:  # noqa: BLE001 - the layout built; the estimate stands without the tracker
        result["tracked_error"] = f"{type(exc).__name__}: {exc}"[:500]
    return result


def run_rank(cfg: RunConfig) -> None:
    """This process's rank, from RANK, WORLD_SIZE, ... set by the launcher."""
    resolved = resolve(cfg)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world != resolved.layout.world_size:
        raise ConfigError(
            "launcher",
            f"the launcher started {world} ranks but the config's layout needs {resolved.layout.world_size} ({resolved.layout.describe()}).",
        )
    run_worker(WorkerJob(cfg=cfg, device_type=resolved.device.type, layout=resolved.layout, backend=resolved.backend))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m qwen3_trn.rank", description=__doc__.splitlines()[0])
    parser.add_argument("config", help="a resolved config.yaml written by python -m qwen3_trn")
    parser.add_argument("--check", action="store_true", help="build rank 0 on the fake backend, do not train")
    args = parser.parse_args(argv)
    try:
        cfg = load_run_config(args.config)
        if args.check:
            print(json.dumps(check_layout(cfg)))
        else:
            run_rank(cfg)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
