"""The same Trainer.Config run straight through torchtitan's Python API (no Hydra, no launcher,
no progress view, torchtitan's own MetricsProcessor). Used by framework_overhead.py.

    python benchmarks/titan_direct.py OUT_DIR [key=value ...]

Prints one JSON line per step: step, loss, tps, seconds since $QWEN3_TRN_LAUNCH_TIME.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import time

LAUNCH = float(os.environ.get("QWEN3_TRN_LAUNCH_TIME", time.time()))
STEP_LINE = re.compile(r"step:\s*(\d+)\s+loss:\s*([\d.]+).*tps:\s*([\d,]+)")


class StepCapture(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        match = STEP_LINE.search(record.getMessage())
        if match:
            step, loss, tps = match.groups()
            print(
                json.dumps(
                    {
                        "step": int(step),
                        "loss": float(loss),
                        "tps": float(tps.replace(",", "")),
                        "seconds_since_launch": time.time() - LAUNCH,
                    }
                ),
                flush=True,
            )


def main() -> None:
    out_dir, overrides = sys.argv[1], sys.argv[2:]
    from hydra import compose, initialize_config_dir
    from torchtitan.components.metrics import MetricsProcessor

    from qwen3_trn.app import to_run_config
    from qwen3_trn.config import register_schema
    from qwen3_trn.convert import compute_dtype, to_trainer_config
    from qwen3_trn.devices import resolve_device
    from qwen3_trn.layout import resolve_layout

    register_schema()
    conf = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "conf")
    with initialize_config_dir(config_dir=os.path.abspath(conf), version_base="1.3"):
        cfg = to_run_config(compose("config", overrides=[*overrides, f"output_dir={out_dir}"]))
    device = resolve_device(cfg.device.type)
    layout = resolve_layout(cfg.parallelism, 1, 1)
    device.activate(compute_dtype(cfg, device))
    config = to_trainer_config(cfg, device, layout)
    config.metrics = MetricsProcessor.Config(log_freq=1, disable_color_printing=True)

    root = logging.getLogger()
    root.handlers.clear()
    root.setLevel(logging.INFO)
    root.addHandler(StepCapture())
    os.environ.update(
        {
            "RANK": "0",
            "LOCAL_RANK": "0",
            "WORLD_SIZE": "1",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": os.environ.get("MASTER_PORT", "29531"),
        }
    )
    trainer = config.build()
    trainer.train()
    trainer.close()


if __name__ == "__main__":
    main()
