"""``python -m qwen3_trn [group=option ...] [key=value ...]``: compose, check, launch."""

import hydra
from omegaconf import DictConfig

from qwen3_trn.app import run
from qwen3_trn.config import register_schema

register_schema()


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    run(cfg)


if __name__ == "__main__":
    main()
