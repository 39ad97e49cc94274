"""qwen3_trn: train Qwen3 with torchtitan on Trainium, CUDA and CPU, configured with Hydra.
The package's layers: docs/architecture.md.
"""
