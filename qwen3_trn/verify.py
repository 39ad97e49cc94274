"""Does a run's Hugging Face export compute what torchtitan trained?

``python -m qwen3_trn.verify <run dir> [--export DIR] [--atol 1e-4] [--moe-rtol 0.01]``

Loads the export with transformers in a fresh interpreter and generates, builds the run's
torchtitan trainer from its DCP checkpoint of the same step, and compares their logits: within
``--atol`` for dense models; for MoE models, against torchtitan with ``expert_bias`` zeroed
(HF has no slot for it), within ``--moe-rtol``. Exits 1 on a mismatch, 2 on bad input. The
helpers are shared with ``tools/roundtrip.py``. docs/export.md says more.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from qwen3_trn.cli.exits import imports_of_entry_point

# A torchtitan that lacks what the package uses: exit 2 as the command (qwen3_trn.cli.exits).
with imports_of_entry_point(__name__):
    from qwen3_trn.common.errors import ConfigError
    from qwen3_trn.common.local_tensors import local_tensor
    from qwen3_trn.config.schema import CompileBackend, DeviceType, Mode, ParamDType
    from qwen3_trn.hf.export import latest_hf_export
    from qwen3_trn.hf.reference import MOE_ARCHITECTURE, export_side, in_clean_process
    from qwen3_trn.launch.local import LocalLauncher
    from qwen3_trn.launch.node import environment, one_rank_world
    from qwen3_trn.results.records import CONFIG_FILE, load_run_config
    from qwen3_trn.run.preflight import prepare
    from qwen3_trn.run.worker import build_trainer

PROMPT = "def sorted(iterable):"


@contextmanager
def single_rank() -> Iterator[None]:
    """This process as rank 0 of a world of 1, the environment and process group restored after."""
    with environment(one_rank_world()):
        try:
            yield
        finally:
            if torch.distributed.is_initialized():
                torch.distributed.destroy_process_group()


def load_into_titan(cfg) -> Any:
    """The trainer for ``cfg`` (any backend) with its initial checkpoint loaded, no training.
    Call inside ``single_rank()``; close the trainer when done."""
    prepared = prepare(cfg)  # every preflight check, including checkpoint checks
    prepared.trainer_config.metrics.console_progress = False
    trainer = build_trainer(cfg, prepared.device, prepared.layout, prepared.backend, prepared.trainer_config)
    if not trainer.checkpointer.load(step=-1):
        raise RuntimeError(f"torchtitan loaded no checkpoint from {prepared.trainer_config.checkpoint.initial_load_path}")
    return trainer


def titan_logits(trainer, tokens: torch.Tensor) -> torch.Tensor:
    """Full logits of the trainer's model (its lm_head included) for ``tokens``."""
    model = trainer.model_parts[0]
    skip = getattr(model, "_skip_lm_head", False)
    model._skip_lm_head = False
    try:
        with torch.no_grad():
            return model(tokens).float()
    finally:
        model._skip_lm_head = skip


@torch.no_grad()
def zero_expert_bias(model: torch.nn.Module) -> float:
    """Set torchtitan's MoE load-balancing biases to zero; returns their largest magnitude."""
    largest = 0.0
    for name, buffer in model.named_buffers():
        if name.rsplit(".", 1)[-1].startswith("expert_bias"):
            local = local_tensor(buffer)
            largest = max(largest, local.abs().max().item() if local.numel() else 0.0)
            local.zero_()
    return largest


# --------------------------------------------------------------------------------------------
# Verifying a run's export
# --------------------------------------------------------------------------------------------


@dataclass(kw_only=True)
class LogitCheck:
    """The tolerances of a logit comparison and what failed (shared with the round trip's report)."""

    atol: float = 1e-4
    moe_rtol: float = 0.01
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures


@dataclass(kw_only=True)
class ExportReport(LogitCheck):
    run_dir: str
    export: str
    step: int
    architecture: str = ""
    model_class: str = ""
    tokenizer_class: str = ""
    loading: dict[str, list[str]] = field(default_factory=dict)
    prompt: str = PROMPT
    generated: str = ""
    generated_tokens: int = 0
    max_logit_diff: float = float("nan")
    rel_logit_diff: float = float("nan")
    # MoE: torchtitan's model as trained, load-balancing bias included (not part of the check)
    rel_logit_diff_as_trained: float = float("nan")
    max_expert_bias: float = float("nan")

    def render(self) -> str:
        lines = [
            f"export        {self.export} (step {self.step}, {self.architecture})",
            (
                f"loaded as     {self.model_class} + {self.tokenizer_class}; missing {self.loading.get('missing_keys', [])}, "
                f"unexpected {self.loading.get('unexpected_keys', [])}, mismatched {self.loading.get('mismatched_keys', [])}"
            ),
            f"generate      {self.prompt!r} -> {self.generated!r} ({self.generated_tokens} new tokens)",
            f"logits        HF vs torchtitan: max |diff| {self.max_logit_diff:.3g}, relative {self.rel_logit_diff:.3g} "
            + (
                f"(MoE, load-balancing bias left out; tolerance: relative {self.moe_rtol:g})"
                if self.architecture == MOE_ARCHITECTURE
                else f"(tolerance: {self.atol:g})"
            ),
        ]
        if self.architecture == MOE_ARCHITECTURE:
            lines.append(
                f"as trained    relative {self.rel_logit_diff_as_trained:.3g} with torchtitan's expert_bias "
                f"(max |bias| {self.max_expert_bias:.3g}), which HF Qwen3-MoE cannot hold"
            )
        return "\n".join(lines + ([f"FAIL: {f}" for f in self.failures] or ["OK"]))


def _titan_config(run_dir: Path, step: int, scratch: Path):
    cfg = load_run_config(run_dir / CONFIG_FILE)
    checkpoint = run_dir / cfg.checkpoint.folder / f"step-{step}"
    if not (checkpoint / ".metadata").is_file():
        raise ConfigError(
            "checkpoint.enable",
            f"{checkpoint} holds no DCP checkpoint, which the comparison loads into torchtitan; train with "
            "checkpoint=hf_export checkpoint.enable=true (DCP checkpoints are saved at the last step too).",
        )
    cfg.output_dir = str(scratch)
    cfg.mode = Mode.train
    cfg.device.type = DeviceType.cpu
    cfg.launcher = LocalLauncher.Config()
    cfg.checkpoint.resume_from = str(checkpoint)
    cfg.checkpoint.enable = False
    cfg.checkpoint.hf_export = False
    cfg.validation.enable = False
    cfg.logger.backends = []
    cfg.training.mixed_precision_param = ParamDType.float32
    cfg.compile.backend = CompileBackend.off
    return cfg


def _relative(logits: torch.Tensor, reference: torch.Tensor) -> float:
    return ((logits - reference).norm() / reference.norm()).item()


def verify_export(
    run_dir: str | Path,
    export: str | Path | None = None,
    atol: float = 1e-4,
    moe_rtol: float = 0.01,
    seq_len: int = 64,
    new_tokens: int = 8,
) -> ExportReport:
    run = Path(run_dir).expanduser().resolve()
    if not (run / "config.yaml").is_file():
        raise ConfigError("run_dir", f"'{run_dir}' holds no config.yaml; pass a run directory written by python -m qwen3_trn.")
    folder = (
        Path(export).expanduser().resolve()
        if export
        else latest_hf_export(run / load_run_config(str(run / "config.yaml")).checkpoint.hf_folder)
    )
    if folder is None or not (folder / "config.json").is_file():
        raise ConfigError("--export", f"no Hugging Face export found in {run}; train with checkpoint=hf_export, or pass --export DIR.")
    step = int(folder.name.removeprefix("step-")) if folder.name.removeprefix("step-").isdigit() else -1
    config = json.loads((folder / "config.json").read_text())
    report = ExportReport(
        run_dir=str(run), export=str(folder), step=step, architecture=config["architectures"][0], atol=atol, moe_rtol=moe_rtol
    )
    length = min(seq_len, int(config.get("max_position_embeddings") or seq_len))
    tokens = torch.randint(0, int(config["vocab_size"]), (2, length), generator=torch.Generator().manual_seed(0))

    hf = in_clean_process(export_side, str(folder), tokens, PROMPT, new_tokens)
    report.model_class, report.tokenizer_class = hf["model_class"], hf["tokenizer_class"]
    report.loading, report.generated, report.generated_tokens = hf["loading"], hf["generated"], hf["generated_tokens"]

    with tempfile.TemporaryDirectory(prefix="qwen3_trn_verify_") as scratch, single_rank():
        trainer = load_into_titan(_titan_config(run, step, Path(scratch)))
        try:
            titan = titan_logits(trainer, tokens)
            if report.architecture == MOE_ARCHITECTURE:
                report.rel_logit_diff_as_trained = _relative(titan, hf["logits"])
                report.max_expert_bias = zero_expert_bias(trainer.model_parts[0])
                titan = titan_logits(trainer, tokens)
        finally:
            trainer.close()
    report.max_logit_diff = (titan - hf["logits"]).abs().max().item()
    report.rel_logit_diff = _relative(titan, hf["logits"])

    if report.model_class != report.architecture:
        report.failures.append(f"transformers built {report.model_class}, config.json names {report.architecture}")
    problems = {k: v for k, v in report.loading.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
    if problems:
        report.failures.append(f"transformers did not load the export cleanly: {problems}")
    if report.generated_tokens != new_tokens:
        report.failures.append(f"generate produced {report.generated_tokens} new tokens, not {new_tokens}")
    if report.architecture == MOE_ARCHITECTURE:
        if not report.rel_logit_diff <= moe_rtol:
            report.failures.append(f"logits differ by {report.rel_logit_diff:.3g} (relative) > {moe_rtol:g}")
    elif not report.max_logit_diff <= atol:
        report.failures.append(f"logits differ by up to {report.max_logit_diff:.3g} > {atol:g}")
    folder.with_name(folder.name + ".verify.json").write_text(json.dumps({**asdict(report), "ok": report.ok}, indent=2) + "\n")
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m qwen3_trn.verify", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", help="a run directory trained with checkpoint=hf_export checkpoint.enable=true")
    parser.add_argument("--export", default=None, help="the export folder (default: the run's last <hf_folder>/step-N)")
    parser.add_argument("--atol", type=float, default=1e-4, help="dense models: max absolute logit difference accepted")
    parser.add_argument(
        "--moe-rtol", type=float, default=0.01, help="MoE models: relative logit difference accepted (load-balancing bias left out)"
    )
    parser.add_argument("--verbose", action="store_true", help="show torchtitan's log")
    args = parser.parse_args(argv)
    run_check(lambda: verify_export(args.run_dir, args.export, args.atol, args.moe_rtol), args.verbose)


def run_check(check, verbose: bool) -> None:
    """Run ``check`` (quietly unless ``verbose``) and print its report; exit 0 passed, 1 failed,
    2 on a ConfigError."""
    if not verbose:
        logging.getLogger().setLevel(logging.WARNING)
        for name in ("torchtitan", "root"):
            logging.getLogger(name).setLevel(logging.WARNING)
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    try:
        report = check()
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    print(report.render())
    sys.exit(0 if report.ok else 1)


if __name__ == "__main__":
    main()
