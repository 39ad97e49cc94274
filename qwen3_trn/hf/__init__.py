"""Hugging Face checkpoints for backend=hf_v5: state-dict adapter, trainer, checks, round trip."""
