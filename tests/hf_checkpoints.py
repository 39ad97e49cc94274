"""Small random Hugging Face Qwen3 checkpoints, for tests and for trying the round trip offline.

``python -m tests.hf_checkpoints <out dir> [--moe] [--untied] [--dtype bfloat16] [--shard-size 100KB]``,
run from a checkout, writes a directory ``transformers.AutoModelForCausalLM.from_pretrained`` loads: config.json
(with ``architectures``), safetensors weights and the project's embedded tokenizer.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import torch

from qwen3_trn.data.embedded import tokenizer_dir
from qwen3_trn.models.architecture import Qwen3Architecture
from qwen3_trn.models.hf_config import hf_config_dict

DENSE = Qwen3Architecture(
    n_layers=2,
    dim=64,
    n_heads=4,
    n_kv_heads=2,
    head_dim=16,
    vocab_size=2048,
    max_seq_len=256,
    rope_theta=1_000_000.0,
    fuse_qkv=True,
    tie_embeddings=True,
    hidden_dim=128,
)
# Qwen3-MoE: 4 experts, top-2, separate lm_head.
MOE = dataclasses.replace(DENSE, tie_embeddings=False, hidden_dim=None, num_experts=4, top_k=2, moe_hidden_dim=32)


def read_config(folder: str | Path) -> dict[str, Any]:
    """The checkpoint's config.json."""
    return json.loads((Path(folder) / "config.json").read_text())


def make_random_hf_checkpoint(
    out_dir: str | Path,
    arch: Qwen3Architecture = DENSE,
    *,
    dtype: str = "float32",
    seed: int = 0,
    max_shard_size: str | None = None,
    with_tokenizer: bool = True,
) -> Path:
    """Save a randomly initialised HF Qwen3 / Qwen3-MoE model for ``arch`` into ``out_dir``.

    Every weight is random (norm weights around 1, not exactly 1), so a checkpoint mix-up of
    any two tensors shows in the logits; MoE routers get a large std so routing is decisive.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    values = hf_config_dict(arch)
    config = AutoConfig.for_model(values["model_type"], **{k: v for k, v in values.items() if k != "model_type"})
    generator = torch.Generator().manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.1 * noise)
            elif name.endswith("mlp.gate.weight"):
                # Decisive routers (as trained ones are): near-ties would let last-bit differences
                # flip an expert choice and hide a real mismatch in noise.
                param.copy_(1.0 * noise)
            else:
                param.copy_(0.05 * noise)
    if arch.tie_embeddings:
        model.tie_weights()
    model = model.to(getattr(torch, dtype))
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(out, **kwargs)
    if with_tokenizer:
        for source in Path(tokenizer_dir()).iterdir():
            if source.is_file():
                shutil.copyfile(source, out / source.name)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.hf_checkpoints", description=__doc__.splitlines()[0])
    parser.add_argument("out", help="directory to write")
    parser.add_argument("--moe", action="store_true", help="a Qwen3-MoE (4 experts, top-2) instead of dense Qwen3")
    parser.add_argument("--untied", action="store_true", help="separate lm_head (dense only; MoE is always untied)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--shard-size", default=None, help="e.g. 100KB to write several safetensors files + index")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    arch = MOE if args.moe else dataclasses.replace(DENSE, tie_embeddings=not args.untied)
    path = make_random_hf_checkpoint(args.out, arch, dtype=args.dtype, seed=args.seed, max_shard_size=args.shard_size)
    print(path)


if __name__ == "__main__":
    main()
