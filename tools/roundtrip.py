"""HF checkpoint -> torchtitan transformers-backend model -> HF checkpoint, verified.

``python tools/roundtrip.py <hf dir> [--out DIR] [--atol 1e-4]``

1. builds the backend=hf_v5 trainer for ``<hf dir>``'s own config (model.hf_model=<hf dir>, no
   size overrides) and loads the weights exactly as a fine-tuning run does
   (``checkpoint.initial_load_path=<hf dir>``: preflight shape check, then torchtitan's DCP load
   through the HF storage reader and the state-dict adapter);
2. saves the model back with torchtitan's HF writer (the ``checkpoint=hf_export`` path),
   in the source's dtype, plus config.json and tokenizer files, into ``--out``;
3. compares the safetensors key sets of source and copy: for a tied-embedding Qwen3 the only
   acceptable difference is ``lm_head.weight``; anything else fails with the keys listed;
4. compares tensors, and logits of the source model, the loaded torchtitan model and the
   re-saved copy (both HF models loaded with ``AutoModelForCausalLM.from_pretrained``): the copy
   must match within ``--atol``; so must the torchtitan model for dense Qwen3, while for MoE
   (torchtitan computes experts in bf16) its relative difference must stay within ``--moe-rtol``.

Prints the report (and writes ``roundtrip.json`` next to the copy); exits 1 on any failure,
2 on a configuration error. A small checkpoint to try it on offline:
``python -m tests.hf_checkpoints <out dir>``.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from qwen3_trn.backends.hf_v5 import HfV5Backend
from qwen3_trn.common.errors import ConfigError
from qwen3_trn.config.schema import DeviceType, ParamDType, RunConfig
from qwen3_trn.hf.checkpoint import checkpoint_shapes, safetensors_files
from qwen3_trn.hf.export import save_hf_weights, write_hf_model_files
from qwen3_trn.hf.reference import hf_model, in_clean_process, loading_info
from qwen3_trn.models.hf_config import architecture_from_hf
from qwen3_trn.results.records import write_json_atomic
from qwen3_trn.verify import LogitCheck, load_into_titan, run_check, single_rank, titan_logits

LM_HEAD = "lm_head.weight"


def read_config(folder: str | Path) -> dict[str, Any]:
    return json.loads((Path(folder) / "config.json").read_text())


def checkpoint_dtype(folder: str | Path) -> str:
    """The torch dtype name most of the checkpoint's floating tensors are stored in."""
    names = {"F32": "float32", "BF16": "bfloat16", "F16": "float16", "F64": "float64"}
    counts: dict[str, int] = {}
    for _, dtype in checkpoint_shapes(folder).values():
        if dtype in names:
            counts[names[dtype]] = counts.get(names[dtype], 0) + 1
    return max(counts, key=counts.get) if counts else "float32"


@dataclass(kw_only=True)
class RoundTripReport(LogitCheck):
    source: str
    output: str
    architecture: str
    tied_embeddings: bool
    dtype: str
    missing_keys: list[str] = field(default_factory=list)  # in the source, not in the copy
    unexpected_keys: list[str] = field(default_factory=list)  # in the copy, not in the source
    acceptable_differences: list[str] = field(default_factory=list)
    max_tensor_diff: float = 0.0
    changed_tensors: list[str] = field(default_factory=list)
    hf_load_missing: list[str] = field(default_factory=list)
    hf_load_unexpected: list[str] = field(default_factory=list)
    hf_load_mismatched: list[str] = field(default_factory=list)
    max_logit_diff_titan: float = float("nan")  # torchtitan model vs source HF model
    rel_logit_diff_titan: float = float("nan")  # ||titan - source|| / ||source||
    max_logit_diff_reloaded: float = float("nan")  # re-saved HF model vs source HF model
    moe_rtol: float = 0.02

    def render(self) -> str:
        def keys(items: list[str]) -> str:
            return ", ".join(items) if items else "none"

        lines = [
            f"source              {self.source} ({self.architecture}, {self.dtype}, tied embeddings: {self.tied_embeddings})",
            f"copy                {self.output}",
            f"missing keys        {keys(self.missing_keys)}",
            f"unexpected keys     {keys(self.unexpected_keys)}",
            f"acceptable          {keys(self.acceptable_differences)}",
            f"tensors             max |source - copy| = {self.max_tensor_diff:.3g}"
            + (f" (changed: {keys(self.changed_tensors[:5])})" if self.changed_tensors else ""),
            f"HF load of copy     missing {keys(self.hf_load_missing)}; unexpected {keys(self.hf_load_unexpected)}; "
            f"mismatched {keys(self.hf_load_mismatched)}",
            f"max logit diff      re-saved copy vs source {self.max_logit_diff_reloaded:.3g} (atol {self.atol:g}); "
            f"torchtitan model vs source {self.max_logit_diff_titan:.3g} (relative {self.rel_logit_diff_titan:.3g})",
        ]
        lines += [f"FAIL: {failure}" for failure in self.failures] or ["OK"]
        return "\n".join(lines)


def _run_config(source: Path, run_dir: Path, seq_len: int):
    arch = architecture_from_hf(read_config(source), str(source))
    cfg = RunConfig(output_dir=str(run_dir), backend=HfV5Backend.Config())
    cfg.device.type = DeviceType.cpu
    # hf_model carries the architecture; the flavor only has to be of the same kind (no overrides).
    cfg.model.flavor = "debugmodel_moe" if arch.is_moe else "debugmodel"
    cfg.model.hf_model = str(source)
    cfg.model.hf_assets_path = str(source) if (source / "tokenizer.json").is_file() else None
    cfg.checkpoint.initial_load_path = str(source)
    cfg.training.seq_len = min(seq_len, arch.max_seq_len)
    cfg.training.local_batch_size = 1
    cfg.training.steps = 1
    cfg.training.mixed_precision_param = ParamDType.float32
    cfg.logger.backends = []
    cfg.validation.enable = False
    return cfg, arch


def key_differences(before, after, tied: bool) -> tuple[list[str], list[str], list[str]]:
    """(missing, unexpected, acceptable): keys of the source absent from the copy, keys of the
    copy absent from the source, and the differences a tied-embedding Qwen3 may have (only
    ``lm_head.weight``, which is the embedding itself)."""
    allowed = {LM_HEAD} if tied else set()
    missing = sorted(set(before) - set(after))
    unexpected = sorted(set(after) - set(before))
    acceptable = [k for k in missing + unexpected if k in allowed]
    return [k for k in missing if k not in allowed], [k for k in unexpected if k not in allowed], acceptable


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for file in sorted(folder.glob("*.safetensors")):
        out.update(load_file(str(file)))
    return out


def _hf_side(source: str, copy: str, tokens: torch.Tensor) -> dict[str, Any]:
    """Logits of the source and of the copy as plain transformers loads them, plus the loading
    info of the copy. Runs in a fresh interpreter (see ``qwen3_trn.hf.reference.in_clean_process``)."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    original = hf_model(Path(source))
    reloaded, info = hf_model(Path(copy), output_loading_info=True)
    with torch.no_grad():
        return {"source": original(tokens).logits.float(), "copy": reloaded(tokens).logits.float(), "info": loading_info(info)}


def roundtrip(
    source: str | Path, out: str | Path | None = None, atol: float = 1e-4, seq_len: int = 64, moe_rtol: float = 0.02
) -> RoundTripReport:
    """Run the round trip; ``out`` defaults to ``<source>-roundtrip``. Raises ConfigError for a
    source that is not a usable HF Qwen3 directory."""
    src = Path(source).expanduser().resolve()
    if not (src / "config.json").is_file():
        raise ConfigError("source", f"'{source}' has no config.json; pass a Hugging Face model directory.")
    if not safetensors_files(src):
        raise ConfigError("source", f"'{source}' holds no *.safetensors files; pass a Hugging Face model directory with weights.")
    dst = Path(out).expanduser().resolve() if out else src.with_name(src.name + "-roundtrip")
    if dst.exists() and any(dst.iterdir()):
        raise ConfigError("--out", f"'{dst}' exists and is not empty; choose a new directory.")
    dst.mkdir(parents=True, exist_ok=True)
    dtype = checkpoint_dtype(src)

    run_dir = Path(tempfile.mkdtemp(prefix="qwen3_trn_roundtrip_"))
    cfg, arch = _run_config(src, run_dir, seq_len)
    tied = arch.tie_embeddings
    report = RoundTripReport(
        source=str(src),
        output=str(dst),
        architecture=read_config(src)["architectures"][0],
        tied_embeddings=tied,
        dtype=dtype,
        atol=atol,
        moe_rtol=moe_rtol,
    )
    tokens = torch.randint(0, arch.vocab_size, (2, cfg.training.seq_len), generator=torch.Generator().manual_seed(0))

    with single_rank():
        trainer = load_into_titan(cfg)
        try:
            titan = titan_logits(trainer, tokens)
            save_hf_weights(trainer.checkpointer, dst, dtype)
            hf_config_dir = trainer.config.hf_model
        finally:
            trainer.close()
    write_hf_model_files(dst, read_config(hf_config_dir), src if (src / "tokenizer.json").is_file() else None, dtype)

    # Keys and tensors.
    before, after = _tensors(src), _tensors(dst)
    allowed = {LM_HEAD} if tied else set()
    report.missing_keys, report.unexpected_keys, report.acceptable_differences = key_differences(before, after, tied)
    for key in sorted(set(before) & set(after)):
        a, b = before[key], after[key]
        if a.shape != b.shape:
            report.changed_tensors.append(f"{key} {list(a.shape)}->{list(b.shape)}")
            report.max_tensor_diff = float("inf")
            continue
        diff = (a.float() - b.float()).abs().max().item() if a.numel() else 0.0
        if diff > 0:
            report.changed_tensors.append(key)
        report.max_tensor_diff = max(report.max_tensor_diff, diff)
    if report.missing_keys:
        report.failures.append(f"keys lost in the round trip: {', '.join(report.missing_keys)}")
    if report.unexpected_keys:
        report.failures.append(f"keys added by the round trip: {', '.join(report.unexpected_keys)}")
    if report.changed_tensors:
        report.failures.append(f"tensor values changed: {', '.join(report.changed_tensors[:10])}")

    # Logits.
    hf = in_clean_process(_hf_side, str(src), str(dst), tokens)
    info = hf["info"]
    report.hf_load_missing = sorted(k for k in info.get("missing_keys", []) if k not in allowed)
    report.hf_load_unexpected = sorted(info.get("unexpected_keys", []))
    report.hf_load_mismatched = sorted(info.get("mismatched_keys", []))
    report.max_logit_diff_reloaded = (hf["copy"] - hf["source"]).abs().max().item()
    report.max_logit_diff_titan = (titan - hf["source"]).abs().max().item()
    report.rel_logit_diff_titan = ((titan - hf["source"]).norm() / hf["source"].norm()).item()
    if report.hf_load_missing or report.hf_load_unexpected or report.hf_load_mismatched:
        report.failures.append(
            "transformers did not load the copy cleanly: missing "
            f"{report.hf_load_missing}, unexpected {report.hf_load_unexpected}, mismatched {report.hf_load_mismatched}"
        )
    if not report.max_logit_diff_reloaded <= atol:
        report.failures.append(f"re-saved model's logits differ from the source by {report.max_logit_diff_reloaded:.3g} > {atol:g}")
    if arch.is_moe:
        # torchtitan's GroupedExperts computes every expert in bf16 (native and hf_v5 alike), so
        # the torchtitan model matches an fp32 HF model only to bf16 precision.
        if not report.rel_logit_diff_titan <= moe_rtol:
            report.failures.append(
                f"torchtitan model's logits differ from the source by {report.rel_logit_diff_titan:.3g} (relative) > {moe_rtol:g}"
            )
    elif not report.max_logit_diff_titan <= atol:
        report.failures.append(f"torchtitan model's logits differ from the source by {report.max_logit_diff_titan:.3g} > {atol:g}")
    write_json_atomic(dst / "roundtrip.json", {**asdict(report), "ok": report.ok})
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python tools/roundtrip.py", description=__doc__.splitlines()[0])
    parser.add_argument("source", help="Hugging Face model directory (config.json + *.safetensors)")
    parser.add_argument("--out", default=None, help="new directory for the re-saved copy (default: <source>-roundtrip)")
    parser.add_argument("--atol", type=float, default=1e-4, help="max absolute logit difference accepted")
    parser.add_argument(
        "--moe-rtol",
        type=float,
        default=0.02,
        help="MoE only: relative logit difference accepted between the torchtitan model (bf16 experts) and the source",
    )
    parser.add_argument("--seq-len", type=int, default=64, help="tokens per sequence in the logits check")
    parser.add_argument("--verbose", action="store_true", help="show torchtitan's log")
    args = parser.parse_args(argv)
    run_check(lambda: roundtrip(args.source, args.out, args.atol, args.seq_len, args.moe_rtol), args.verbose)


if __name__ == "__main__":
    main()
