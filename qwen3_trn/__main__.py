"""``python -m qwen3_trn [group=option ...] [key=value ...]``: compose, check, launch.

The exit status is the command's contract (``qwen3_trn.exits``): 0 done, 2 bad config or input,
1 a run that started and failed, 130 interrupted. Hydra reports its own composition errors and
exits 1; here they are raised instead (``HYDRA_FULL_ERROR``) and reported like any other bad
input, naming the key and the file.

Composing needs only Hydra and the typed schema (``qwen3_trn.config``): a typo, ``--help`` and
``--cfg`` are answered before the run's modules (``qwen3_trn.app``: torch, torchtitan,
transformers) are imported, which Hydra's task function does once the config composed.
"""

import os
import sys
from pathlib import Path

from qwen3_trn.allocator import exec_with_tcmalloc

# First, before torch is loaded: an allocator that replaces malloc must be in the process from
# its start, so this may restart the command once with tcmalloc preloaded (qwen3_trn.allocator).
exec_with_tcmalloc()

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from qwen3_trn.config.composition import refuse_shadowed_config_files  # noqa: E402
from qwen3_trn.config.store import register_schema  # noqa: E402
from qwen3_trn.early import answer_early, no_run_dir_left  # noqa: E402
from qwen3_trn.exits import exit_status  # noqa: E402
from qwen3_trn.records import TRACEBACK_ENV  # noqa: E402

register_schema()

# An absolute path: Hydra then searches the directory itself. A relative one is looked up as
# the package ``qwen3_trn.conf`` when the entry point is the installed ``qwen3-trn`` script,
# which Hydra refuses without an __init__.py in conf/.
CONF_DIR = Path(__file__).resolve().parent / "conf"


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def hydra_main(cfg: DictConfig) -> None:
    # A single run's config typed and its ranges and paths checked first (qwen3_trn.early), so
    # that such bad input is answered before the run's modules load. Imported here, not above:
    # they load only for a config that passed and a command that runs it. A ConfigError raised on
    # import (qwen3_trn.titan) exits 2 (main).
    typed = answer_early(cfg)
    with exit_status(), no_run_dir_left():
        from qwen3_trn.app import run

    run(cfg, typed)


def config_dirs(argv: list[str]) -> list[Path]:
    """The config search directories of this command line: ``--config-dir``, then ``conf/``."""
    dirs = []
    for i, arg in enumerate(argv):
        for flag in ("--config-dir", "-cd"):
            if arg == flag and i + 1 < len(argv):
                dirs.append(Path(argv[i + 1]))
            elif arg.startswith(flag + "="):
                dirs.append(Path(arg.split("=", 1)[1]))
    return [*dirs, CONF_DIR]


def main() -> None:
    if os.environ.get("HYDRA_FULL_ERROR"):
        os.environ.setdefault(TRACEBACK_ENV, "1")  # the user asked for tracebacks
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra raises composition errors rather than exiting 1
    search_dirs = config_dirs(sys.argv[1:])
    with exit_status(search_dirs):
        refuse_shadowed_config_files(search_dirs, CONF_DIR)
        hydra_main()


if __name__ == "__main__":
    main()
