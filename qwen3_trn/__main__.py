"""``python -m qwen3_trn [group=option ...] [key=value ...]``: compose, check, launch.

Composing imports only Hydra and the config layer, so a typo, ``--help`` and ``--cfg`` are
answered before torch and torchtitan load (``qwen3_trn.app`` imports them). Hydra's own
composition errors are raised (``HYDRA_FULL_ERROR``) and reported as bad input: ``qwen3_trn.cli.exits``;
a command line that does not compose has its other problems named beside the first (``every_problem``).
"""

import os
import sys
from pathlib import Path

from qwen3_trn.common.allocator import exec_with_tcmalloc

# First, before torch is loaded: an allocator that replaces malloc must be in the process from
# its start, so this may restart the command once with tcmalloc preloaded (qwen3_trn.common.allocator).
exec_with_tcmalloc()

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from qwen3_trn.cli.early import CONF_DIR, answer_early, every_problem, no_run_dir_left  # noqa: E402
from qwen3_trn.cli.exits import exit_status  # noqa: E402
from qwen3_trn.config.composition import refuse_shadowed_config_files  # noqa: E402
from qwen3_trn.config.store import register_schema  # noqa: E402
from qwen3_trn.results.records import TRACEBACK_ENV  # noqa: E402

register_schema()

# Whether Hydra composed the config and called the task function (then a problem is the run's).
composed = False


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def hydra_main(cfg: DictConfig) -> None:
    global composed
    composed = True
    # The run's modules are imported here, not above: only for a config that passed
    # answer_early. A ConfigError raised while they import (qwen3_trn.titan) exits 2.
    typed = answer_early(cfg)
    with exit_status(), no_run_dir_left():
        from qwen3_trn.app import run

    run(cfg, typed)


def config_dirs(argv: list[str]) -> list[Path]:
    """``--config-dir``, then ``conf/``."""
    dirs = []
    for i, arg in enumerate(argv):
        for flag in ("--config-dir", "-cd"):
            if arg == flag and i + 1 < len(argv):
                dirs.append(Path(argv[i + 1]))
            elif arg.startswith(flag + "="):
                dirs.append(Path(arg.split("=", 1)[1]))
    return [*dirs, CONF_DIR]


def plain_overrides(argv: list[str]) -> list[str] | None:
    """The overrides of a single run's command line with no other flag, else None (a multirun,
    --config-dir, --cfg: the first composition problem is reported alone)."""
    return None if any(arg.startswith("-") for arg in argv) else argv


def main() -> None:
    if os.environ.get("HYDRA_FULL_ERROR"):
        os.environ.setdefault(TRACEBACK_ENV, "1")  # the user asked for tracebacks
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra raises composition errors rather than exiting 1
    search_dirs = config_dirs(sys.argv[1:])
    with exit_status(search_dirs):
        refuse_shadowed_config_files(search_dirs, CONF_DIR)
        try:
            hydra_main()
        except Exception as exc:
            overrides = plain_overrides(sys.argv[1:])
            if composed or overrides is None or os.environ.get(TRACEBACK_ENV):
                raise
            raise every_problem(exc, overrides, CONF_DIR) from exc


if __name__ == "__main__":
    main()
