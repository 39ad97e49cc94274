"""Qwen3 architectures: torchtitan's flavors with the model group's overrides (``architecture``),
the native model spec (``qwen3``), the inner attention per device (``attention``) and the
matching Hugging Face config (``hf_config``).
"""
