from qwen3_trn.config.schema import RunConfig
from qwen3_trn.config.store import register_schema

__all__ = ["RunConfig", "register_schema"]
