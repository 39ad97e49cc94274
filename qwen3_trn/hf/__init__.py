"""Hugging Face side of the project: the transformers-backend trainer and its fixes
(``trainer``, ``model``), HF state-dict names (``state_dict``), safetensors checkpoints in and
out (``checkpoint``) and the export folder every mode writes (``export``)."""
