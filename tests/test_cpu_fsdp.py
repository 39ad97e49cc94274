"""The CPU adapter's one-rank FSDP reduce: same gradients as FSDP's own, without its copy."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO

# Two copies of one bf16-mixed-precision FSDP model at one gloo rank, one sharded by FSDP alone
# and one through the CPU adapter's parallelize wrapper (ReduceInPlaceAtOneRank); each runs two micro-batches (the second one
# accumulates into the first one's gradients). Prints whether every gradient is bitwise equal,
# how many buffers the adapted reduce asked for and got, and whether the gradients live in them.
_COMPARE = """
import copy, os, torch, torch.distributed as dist
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from qwen3_trn.devices import cpu

os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("PORT", "29561"))
dist.init_process_group("gloo", rank=0, world_size=1)
torch.manual_seed(0)
base = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.SiLU(), torch.nn.Linear(96, 32))
policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
inputs = [torch.randn(8, 64) for _ in range(2)]


class Recording(cpu.ReduceInPlaceAtOneRank):
    inputs = []

    def allocate(self, size, *, dtype, device):
        buffer = super().allocate(size, dtype=dtype, device=device)
        Recording.inputs.append(buffer)  # kept alive, so no address is reused
        return buffer


cpu.ReduceInPlaceAtOneRank = Recording  # what the adapter installs on every FSDP module


def shard(model, **kwargs):  # a parallelize_fn, as torchtitan's applies FSDP
    for layer in (model[0], model[2]):
        fully_shard(layer, mp_policy=policy)
    return fully_shard(model, mp_policy=policy)


def gradients(adapted):
    model = (cpu._adapt_fsdp(shard) if adapted else shard)(copy.deepcopy(base))
    for x in inputs:
        model(x).float().square().mean().backward()
    return [p.grad.to_local() for p in model.parameters()], model


default, _ = gradients(adapted=False)
Recording.inputs.clear()
in_place, model = gradients(adapted=True)
grads = {p.grad.to_local().untyped_storage().data_ptr() for p in model.parameters()}
print("equal", all(torch.equal(a, b) for a, b in zip(default, in_place)))
print("allocations", len(Recording.inputs))
buffers = {b.untyped_storage().data_ptr() for b in Recording.inputs}
print("buffers", len(buffers))
print("grads_in_them", grads <= buffers)
dist.destroy_process_group()
"""


def test_one_rank_reduce_in_place_gives_fsdps_gradients_bitwise():
    done = subprocess.run([sys.executable, "-c", _COMPARE], cwd=REPO, capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr
    facts = dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)
    assert facts["equal"] == "True"
    # Two units x two micro-batches, each asking for an input and an output: the output is the input.
    assert facts["allocations"] == "8"
    assert facts["buffers"] == "4"
    assert facts["grads_in_them"] == "True"
