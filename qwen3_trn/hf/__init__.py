"""Hugging Face side: the transformers-backend trainer and its model fixes, HF state-dict names,
safetensors checkpoints, the export every mode writes, reference models from plain transformers."""
