"""Hugging Face side of the project: the transformers-backend trainer and its fixes
(``trainer``, ``model``), HF state-dict names (``state_dict``), safetensors checkpoints in and
out (``checkpoint``), the export folder every mode writes (``export``), and reference models
from plain transformers in a fresh interpreter that loads nothing else (``reference``)."""
