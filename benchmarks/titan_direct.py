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
    from inprocess import single_rank_trainer_config
    from torchtitan.components.metrics import MetricsProcessor

    _cfg, config = single_rank_trainer_config(overrides, out_dir)
    config.metrics = MetricsProcessor.Config(log_freq=1, disable_color_printing=True)

    root = logging.getLogger()
    root.handlers.clear()
    root.setLevel(logging.INFO)
    root.addHandler(StepCapture())
    trainer = config.build()
    trainer.train()
    trainer.close()


if __name__ == "__main__":
    main()
