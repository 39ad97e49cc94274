"""Reference models as a user gets them: ``from_pretrained`` from plain, unpatched transformers in
a fresh interpreter (``in_clean_process``). Imports nothing of torchtitan or the project, so that
interpreter loads only torch and transformers.
"""

from __future__ import annotations

import functools
import json
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

import torch

MOE_ARCHITECTURE = "Qwen3MoeForCausalLM"


def hf_model(folder: Path, reference: bool = True, **kwargs):
    """``AutoModelForCausalLM.from_pretrained(folder)`` in fp32 (``reference``: SDPA attention and
    the eager experts loop, the plain reference math on any device)."""
    from transformers import AutoModelForCausalLM

    extra: dict[str, Any] = {}
    if reference:
        extra["attn_implementation"] = "sdpa"
        config = json.loads((folder / "config.json").read_text())
        if config.get("architectures", [""])[0] == MOE_ARCHITECTURE:
            extra["experts_implementation"] = "eager"
    return AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32, **extra, **kwargs)


def loading_info(info: dict[str, Any]) -> dict[str, list[str]]:
    return {k: [str(x[0] if isinstance(x, tuple) else x) for x in v] for k, v in info.items() if isinstance(v, (list, set))}


@functools.cache
def _clean_interpreter() -> ProcessPoolExecutor:
    return ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))


def in_clean_process(fn, *args):
    """``fn(*args)`` in a spawned interpreter: building torchtitan's ``HFTransformerModel``
    patches transformers' weight init for the rest of the process (``from_pretrained`` then
    leaves rotary ``inv_freq`` uninitialised), and reference models need unpatched transformers.
    One interpreter serves every call of this process (it imports torch and transformers once);
    nothing of torchtitan ever loads in it, so a call finds it as clean as the first did."""
    try:
        return _clean_interpreter().submit(fn, *args).result()
    except BrokenProcessPool:
        _clean_interpreter.cache_clear()  # it died (killed, out of memory): the next call starts another
        raise


def export_side(folder: str, tokens: torch.Tensor, prompt: str, new_tokens: int) -> dict[str, Any]:
    """What a user gets from the folder: the model and tokenizer as transformers loads them,
    ``generate`` on a prompt, and the logits for ``tokens``."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, info = AutoModelForCausalLM.from_pretrained(folder, output_loading_info=True)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    inputs = tokenizer(prompt, return_tensors="pt")
    with torch.no_grad():
        generated = model.generate(**inputs, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
    new = generated[0, inputs["input_ids"].shape[1] :]
    reference = hf_model(Path(folder))
    with torch.no_grad():
        logits = reference(tokens).logits.float()
    return {
        "model_class": type(model).__name__,
        "tokenizer_class": type(tokenizer).__name__,
        "loading": loading_info(info),
        "generated": tokenizer.decode(new),
        "generated_tokens": int(new.numel()),
        "logits": logits,
    }
