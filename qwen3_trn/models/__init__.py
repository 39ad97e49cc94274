"""Qwen3 architectures: torchtitan's flavors with the model group's overrides applied
(``architecture``, whose ``FIELDS`` table maps every architecture number between torchtitan's
model config, the ``model.*`` overrides and HF ``config.json``), the native model spec built
from them (``qwen3``), the inner attention per device (``attention``) and the Hugging Face
config of the same architecture (``hf_config``)."""
