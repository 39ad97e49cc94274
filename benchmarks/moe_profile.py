"""Profile MoE training steps (torch.profiler): top operators and where the step's time goes.

    python benchmarks/moe_profile.py                         # native, nki_moe, and the dense debugmodel
    python benchmarks/moe_profile.py --configs nki_moe --steps 3 model.top_k=2

Each configuration is built in its own process exactly as ``python -m qwen3_trn`` builds it
(``benchmarks/inprocess.py``), runs ``--warmup`` training steps, then ``--steps`` profiled ones.
Time is attributed to the region of the model that issued it:

* forward: the innermost labelled module or call (router, dispatch, experts, combine, attention,
  feed-forward, embeddings/norms/lm_head/loss, FSDP hooks, optimizer);
* backward: each autograd node goes to the region whose forward op created it (the profiler's
  sequence numbers link them), so "experts" is forward + backward of the expert MLP.

A region's time is the wall time of its ops plus the Python between them. Printed per
configuration: the breakdown (ms per step and share of the step) and the top operators by self
time. The machine may be shared: the absolute figures move with its load, the shares much less.

Per-parameter work (FSDP's casts and reduce, the optimizer) is also set against its floor: the
memory traffic of the passes torch makes over every parameter (``PER_PARAMETER_BYTES``) at this
machine's measured copy bandwidth. With the dense model profiled too, the last lines bound each
MoE configuration: its own model work at the dense model's FLOP rate plus per-parameter work at
that floor, the best MFU ratio to dense this machine allows with these passes; then the same
with every pass at the rate fused AdamW reaches in the step, and with the passes fused into one
(``FUSED_PER_PARAMETER_BYTES``) at that rate.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator

import torch
from inprocess import REPO, single_rank_trainer_config
from torch.autograd.profiler import record_function
from torch.profiler import ProfilerActivity, profile

CONFIGS = {
    "dense": ["backend=native", "model=debugmodel"],
    "native": ["backend=native", "model=debugmodel_moe"],
    "nki_moe": ["backend=nki_moe", "model=debugmodel_moe"],
}
DEFAULT_OVERRIDES = ["model.n_layers=2", "training.seq_len=256", "logger=none"]

# Labels, in the order the breakdown prints them.
ROUTER = "router (gate, top-k, counts)"
DISPATCH = "token permutation (dispatch)"
EXPERTS = "expert MLP (matmuls + SwiGLU)"
COMBINE = "token unpermutation (combine)"
SHARED_EXPERTS = "shared experts"
FEED_FORWARD = "dense feed-forward"
ATTENTION = "attention (qkv, rope, sdpa, out)"
DENSE_SHARED = "embeddings, norms, lm_head, loss"
FSDP = "FSDP (param casts, grad reduce)"
OPTIMIZER = "optimizer (zero, clip, AdamW, lr)"
OTHER = "other (trainer, data, unlabelled)"
REGIONS = (ROUTER, DISPATCH, EXPERTS, COMBINE, SHARED_EXPERTS, FEED_FORWARD, ATTENTION, DENSE_SHARED, FSDP, OPTIMIZER, OTHER)
MOE_REGIONS = (ROUTER, DISPATCH, EXPERTS, COMBINE, SHARED_EXPERTS)


def _module_labels() -> list[tuple[type, str]]:
    from torchtitan.models.common.attention import BaseAttention
    from torchtitan.models.common.embedding import Embedding
    from torchtitan.models.common.feed_forward import FeedForward
    from torchtitan.models.common.moe import (
        GroupedExperts,
        MoE,
        RoutedExperts,
        TokenChoiceTopKRouter,
    )
    from torchtitan.models.common.nn_modules import RMSNorm

    # MoE's own ops (routing map, per-expert counts) count as routing; RoutedExperts' own ops
    # (reshapes around dispatch/combine) as permutation.
    return [
        (MoE, ROUTER),
        (TokenChoiceTopKRouter, ROUTER),
        (RoutedExperts, DISPATCH),
        (GroupedExperts, EXPERTS),
        (BaseAttention, ATTENTION),
        (FeedForward, FEED_FORWARD),
        (Embedding, DENSE_SHARED),
        (RMSNorm, DENSE_SHARED),
    ]


def _label_call(label: str, fn: Callable) -> Callable:
    @functools.wraps(fn)
    def labelled(*args, **kwargs):
        with record_function(label):
            return fn(*args, **kwargs)

    return labelled


def _label_module(module: torch.nn.Module, label: str) -> None:
    # Outermost hooks (prepend) so FSDP's own pre/post-forward hooks run inside: their
    # "FSDP::" ranges still win as the innermost label.
    ranges: list[contextlib.AbstractContextManager] = []

    def enter(_module, _args):
        ranges.append(record_function(label))
        ranges[-1].__enter__()

    def leave(_module, _args, _output):
        ranges.pop().__exit__(None, None, None)

    module.register_forward_pre_hook(enter, prepend=True)
    module.register_forward_hook(leave, always_call=True)


def instrument(trainer) -> None:
    """Label the model's regions and the trainer's optimizer calls for the profiler."""
    from torchtitan import trainer as trainer_module

    model = trainer.model_parts[0]
    labels = _module_labels()
    for name, module in model.named_modules():
        if name.endswith("shared_experts"):
            label = SHARED_EXPERTS
        elif name in ("lm_head", "norm"):
            label = DENSE_SHARED
        else:
            label = next((lab for cls, lab in labels if isinstance(module, cls)), None)
        if label is not None:
            _label_module(module, label)
        dispatcher = getattr(module, "token_dispatcher", None)
        if dispatcher is not None:
            dispatcher.dispatch = _label_call(DISPATCH, dispatcher.dispatch)
            dispatcher.combine = _label_call(COMBINE, dispatcher.combine)
    trainer.loss_fn = _label_call(DENSE_SHARED, trainer.loss_fn)
    trainer.optimizers.step = _label_call(OPTIMIZER, trainer.optimizers.step)
    trainer.optimizers.zero_grad = _label_call(OPTIMIZER, trainer.optimizers.zero_grad)
    trainer.lr_schedulers.step = _label_call(OPTIMIZER, trainer.lr_schedulers.step)
    trainer_module.dist_utils.clip_grad_norm_ = _label_call(OPTIMIZER, trainer_module.dist_utils.clip_grad_norm_)


def _region_of(event, seq_region: dict[int, str]) -> str | None:
    """Innermost label above ``event``; for backward nodes, the region of their forward op."""
    node = event
    while node is not None:
        name = node.name
        if name.startswith("FSDP::"):
            return FSDP
        if name in REGIONS:
            return name
        if name.startswith("autograd::engine::evaluate_function"):
            return seq_region.get(node.sequence_nr) if node.sequence_nr >= 0 else FSDP
        node = node.cpu_parent
    return None


def _is_operator(name: str) -> bool:
    return not (name in REGIONS or name.startswith(("FSDP::", "autograd::engine", "ProfilerStep")))


def breakdown(events, step_seconds: float, steps: int) -> tuple[dict[str, float], dict[str, dict[str, list[float]]]]:
    """(ms per step per region, {region: {operator: [calls, self ms] per step}})."""
    seq_region: dict[int, str] = {}
    for event in events:
        if event.sequence_nr >= 0 and not event.name.startswith("autograd::"):
            region = _region_of(event, {})
            if region is not None:
                seq_region.setdefault(event.sequence_nr, region)
    per_region: dict[str, float] = defaultdict(float)
    per_op: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0.0, 0.0]))
    for event in events:
        region = _region_of(event, seq_region) or OTHER
        self_ms = event.self_cpu_time_total / 1e3 / steps
        per_region[region] += self_ms
        if _is_operator(event.name):
            per_op[region][event.name][0] += 1 / steps
            per_op[region][event.name][1] += self_ms
    per_region[OTHER] += max(0.0, step_seconds * 1e3 - sum(per_region.values()))
    return dict(per_region), {region: dict(ops) for region, ops in per_op.items()}


def top_operators(per_op: dict[str, dict[str, list[float]]], count: int) -> list[tuple[str, float, float]]:
    """The ``count`` operators with the most self time over all regions: (name, calls, ms) per step."""
    total: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for ops in per_op.values():
        for name, (calls, ms) in ops.items():
            total[name][0] += calls
            total[name][1] += ms
    return sorted(((name, calls, ms) for name, (calls, ms) in total.items()), key=lambda row: -row[2])[:count]


def _batches(trainer) -> Iterator:
    return trainer.batch_generator(trainer.dataloader)


def profile_one(overrides: list[str], warmup: int, steps: int, top: int, region_top: int) -> dict:
    with tempfile.TemporaryDirectory() as out_dir:
        cfg, config = single_rank_trainer_config([*overrides, f"training.steps={warmup + steps + 1}"], out_dir)
        trainer = config.build()
        try:
            instrument(trainer)
            data = _batches(trainer)
            for _ in range(warmup):
                trainer.step += 1
                trainer.train_step(data)
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                start = time.perf_counter()
                for _ in range(steps):
                    trainer.step += 1
                    trainer.train_step(data)
                seconds = (time.perf_counter() - start) / steps
            # Unprofiled steps: the profiler's own overhead inflates the profiled ones.
            plain = []
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            for _ in range(steps):
                trainer.step += 1
                t0 = time.perf_counter()
                trainer.train_step(data)
                plain.append(time.perf_counter() - t0)
            faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / steps
        finally:
            trainer.close()
    bandwidth = copy_bandwidth()
    regions, per_op = breakdown(prof.events(), seconds, steps)
    tokens = cfg.training.local_batch_size * cfg.training.seq_len
    metrics = trainer.metrics_processor
    parameters = sum(p.numel() for p in trainer.model_parts[0].parameters())
    adamw_ms = sum(ops.get(FUSED_ADAMW, (0.0, 0.0))[1] for ops in per_op.values())
    return {
        "flops_per_token": metrics.num_flops_per_token,
        "peak_flops": metrics.gpu_peak_flops,
        "parameters": parameters,
        "overrides": overrides,
        "profiled_step_s": seconds,
        "step_s": statistics.median(plain),
        "tokens_per_s": tokens / statistics.median(plain),
        "regions_ms": regions,
        "top_ops": top_operators(per_op, top),
        "region_ops": {region: top_operators({region: ops}, region_top) for region, ops in per_op.items()},
        "threads": torch.get_num_threads(),
        "page_faults_per_step": faults,
        "copy_bandwidth": bandwidth,
        # The fastest per-parameter pass of the step: fused AdamW's bytes over its own time.
        "adamw_bandwidth": parameters * PER_PARAMETER_BYTES["AdamW"] / (adamw_ms / 1e3) if adamw_ms else 0.0,
    }


# Memory traffic of the per-parameter work, bytes per parameter and step, each pass counted once:
# fused AdamW reads fp32 parameter, gradient and both moments and writes three of them back; the
# gradient-norm clip reads the gradients once for the norm and once more to scale them in place;
# FSDP casts each parameter to bf16 and each bf16 gradient back to fp32.
PER_PARAMETER_BYTES = {"AdamW": 28, "clipping": 12, "FSDP casts": 12}
# One pass that clips, steps AdamW and writes the bf16 copy (the gradient's fp32 cast, the norm's
# read and AdamW's own traffic): what fusing the passes would leave.
FUSED_PER_PARAMETER_BYTES = 36
FUSED_ADAMW = "aten::_fused_adamw_"


def copy_bandwidth(elements: int = 64 * 2**20, repeats: int = 15) -> float:
    """Bytes per second moved (read + write) by ``copy_`` between two fp32 buffers: the fastest
    of ``repeats`` copies, so that the floor it sets is one no pass can beat."""
    src, dst = torch.randn(elements), torch.empty(elements)
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        dst.copy_(src)
        seconds.append(time.perf_counter() - start)
    return 2 * 4 * elements / min(seconds)


def print_report(name: str, result: dict) -> None:
    step_ms = result["profiled_step_s"] * 1e3
    print(f"\n=== {name}: {' '.join(result['overrides'])}")
    print(
        f"step {result['step_s'] * 1e3:.0f} ms unprofiled ({result['tokens_per_s']:.0f} tokens/s), "
        f"{step_ms:.0f} ms profiled; {result['threads']} threads, "
        f"{result['page_faults_per_step']:.0f} page faults per step"
    )
    print(f"{'region':38s} {'ms/step':>9s} {'share':>7s}")
    regions = result["regions_ms"]
    for region in REGIONS:
        if regions.get(region, 0.0) > 0:
            print(f"{region:38s} {regions[region]:9.1f} {100 * regions[region] / step_ms:6.1f}%")
            for op, calls, ms in result["region_ops"].get(region, []):
                print(f"    {op[:46]:46s} {calls:6.0f} calls {ms:7.1f} ms")
    moe_ms = sum(regions.get(r, 0.0) for r in MOE_REGIONS)
    if moe_ms:
        print(f"{'  MoE layers in all':38s} {moe_ms:9.1f} {100 * moe_ms / step_ms:6.1f}%")
    # Per-parameter work (FSDP's casts and reduce, the optimizer) scales with the parameter count,
    # not with the tokens: apart from it, the step is the model's forward and backward.
    per_parameter = (regions.get(FSDP, 0.0) + regions.get(OPTIMIZER, 0.0)) / step_ms
    mfu = 100 * result["flops_per_token"] * result["tokens_per_s"] / result["peak_flops"]
    print(
        f"{result['parameters'] / 1e6:.1f} M parameters, {result['flops_per_token'] / 1e6:.1f} MFLOP per token; "
        f"MFU {mfu:.1f} % (unprofiled step); per-parameter work (FSDP + optimizer) {100 * per_parameter:.0f} % "
        f"of the step; MFU of the rest {mfu / (1 - per_parameter):.1f} %"
    )
    floor_ms = 1e3 * result["parameters"] * sum(PER_PARAMETER_BYTES.values()) / result["copy_bandwidth"]
    traffic = ", ".join(f"{name} {size}" for name, size in PER_PARAMETER_BYTES.items())
    print(
        f"per-parameter work {per_parameter * step_ms:.0f} ms; its memory traffic ({traffic} bytes per parameter) "
        f"at this machine's copy bandwidth ({result['copy_bandwidth'] / 1e9:.1f} GB/s) takes at least {floor_ms:.0f} ms"
    )
    print(f"\n{'top operators (self time)':52s} {'calls':>6s} {'ms/step':>9s} {'share':>7s}")
    for op, calls, ms in result["top_ops"]:
        print(f"{op[:52]:52s} {calls:6.0f} {ms:9.1f} {100 * ms / step_ms:6.1f}%")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=2, help="profiled steps (then as many unprofiled)")
    parser.add_argument("--top", type=int, default=15, help="operators in the overall table")
    parser.add_argument("--region-top", type=int, default=0, help="also list this many operators per region")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # child process: profile one config, print JSON
    parser.add_argument("overrides", nargs="*", default=DEFAULT_OVERRIDES)
    args = parser.parse_args()

    if args.one:
        result = profile_one([*CONFIGS[args.one], *args.overrides], args.warmup, args.steps, args.top, args.region_top)
        print("RESULT " + json.dumps(result))
        return
    print(f"torch {torch.__version__}, load average {os.getloadavg()[0]:.2f} (the machine may be shared)")
    results: dict[str, dict] = {}
    for name in args.configs:
        cmd = [
            sys.executable,
            __file__,
            "--one",
            name,
            "--warmup",
            str(args.warmup),
            "--steps",
            str(args.steps),
            "--top",
            str(args.top),
            "--region-top",
            str(args.region_top),
            *args.overrides,
        ]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "KINETO_LOG_LEVEL": "5"}
        done = subprocess.run(cmd, check=False, cwd=REPO, capture_output=True, text=True, env=env)
        lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        if done.returncode or not lines:
            sys.exit(f"failed: {' '.join(cmd)}\n{done.stderr[-3000:]}")
        results[name] = json.loads(lines[-1][len("RESULT ") :])
        print_report(name, results[name])
    if "dense" in results:
        print_bound(results)


def _per_parameter_share(result: dict) -> float:
    regions = result["regions_ms"]
    return (regions.get(FSDP, 0.0) + regions.get(OPTIMIZER, 0.0)) / (result["profiled_step_s"] * 1e3)


def print_bound(results: dict[str, dict]) -> None:
    """The best MFU ratio to dense a MoE step could reach here: the model's own work (all but the
    per-parameter work) at the dense model's FLOP rate, and the per-parameter work at its
    memory-traffic floor; then the same with every pass at fused AdamW's measured rate, and with
    the passes fused into one."""
    dense = results["dense"]
    rest_s_per_flop = dense["step_s"] * (1 - _per_parameter_share(dense)) / dense["flops_per_token"]
    dense_rate = dense["flops_per_token"] / dense["step_s"]
    passes = sum(PER_PARAMETER_BYTES.values())
    print(
        "\nbound: the model's work at the dense model's FLOP rate, per-parameter work at its floor "
        f"({passes} bytes per parameter at the copy bandwidth); then at fused AdamW's own rate; then as one "
        f"fused pass ({FUSED_PER_PARAMETER_BYTES} bytes per parameter) at that rate"
    )
    for name, result in results.items():
        if name == "dense":
            continue
        measured = (result["flops_per_token"] / result["step_s"]) / dense_rate
        rest_s = rest_s_per_flop * result["flops_per_token"]
        cases = [
            (passes, result["copy_bandwidth"]),
            (passes, result["adamw_bandwidth"]),
            (FUSED_PER_PARAMETER_BYTES, result["adamw_bandwidth"]),
        ]
        bounds = []
        for size, bandwidth in cases:
            step_s = rest_s + result["parameters"] * size / bandwidth
            bounds.append(f"{(result['flops_per_token'] / step_s) / dense_rate:.2f} (step >= {step_s * 1e3:.0f} ms)")
        print(
            f"{name}: MFU / dense <= {bounds[0]}; at {result['adamw_bandwidth'] / 1e9:.1f} GB/s <= {bounds[1]}; "
            f"fused <= {bounds[2]}; measured {measured:.2f} ({result['step_s'] * 1e3:.0f} ms)"
        )


if __name__ == "__main__":
    main()
