"""qwen3_trn: a Hydra experiment framework for training Qwen3 with torchtitan on Trainium,
CUDA GPUs and CPUs. ``python -m qwen3_trn`` composes the config groups in ``conf/``, checks
them, and trains; the layers of the package are listed in docs/architecture.md."""
