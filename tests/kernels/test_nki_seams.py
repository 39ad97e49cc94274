"""The nki kernel path at its seams with torch-neuronx and nki-library, on stand-ins that follow
their sources (tests/kernels/neuron_stand_ins.py), and the project's kernel math against
nki-library's numpy goldens."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from qwen3_trn.app import execute, to_run_config
from qwen3_trn.common.errors import ConfigError
from qwen3_trn.kernels import DEVICE_KERNELS, KERNELS, KernelGroupedExperts, layouts, nki_moe
from qwen3_trn.kernels.nki_moe import (
    NKI_KERNEL_LIMITS,
    blockwise_moe_backward_reference,
    blockwise_moe_reference,
    check_nki_moe_shapes,
    probe_nki,
)
from qwen3_trn.run.preflight import prepare
from tests.commands import command_in_process
from tests.conftest import compose_config
from tests.kernels import neuron_stand_ins as stand_ins

# One rank's experts within every kernel limit at LNC=2: H in [512, 8192] and a multiple of
# 512, I/2 a multiple of 32, 8..64 experts.
D, F, E = 512, 64, 8
SEED = ["backend=nki_moe", "model=30B-A3B", "model.n_layers=4", "model.num_experts=64", "model.top_k=4", "device=neuron", "logger=none"]


@pytest.fixture
def neuron_stack(monkeypatch):
    """The stand-in Neuron stack, the nki kernel's probe run afresh (it is memoized per
    process) and its launchers rebuilt for this stack."""
    stack = stand_ins.install(monkeypatch)
    monkeypatch.setattr(KERNELS["nki"], "probe", probe_nki)
    nki_moe._launcher.cache_clear()
    yield stack
    nki_moe._launcher.cache_clear()


@pytest.fixture
def nki_on_cpu(neuron_stack, monkeypatch):
    """The nki kernel also selectable on CPU, where its stand-in launches compute."""
    monkeypatch.setitem(DEVICE_KERNELS, "cpu", (*DEVICE_KERNELS["cpu"], "nki"))
    return neuron_stack


# --------------------------------------------------------------------------- the probe
def test_probe_passes_where_everything_the_kernels_call_imports(neuron_stack):
    assert probe_nki() is None


@pytest.mark.parametrize(
    "missing,named",
    [
        ("nkilib.experimental.moe.bwd.blockwise_mm_backward", "blockwise_mm_bwd"),
        ("nkilib.core.moe.moe_cte.bwmm_shard_on_I:blockwise_mm_baseline_shard_intermediate", "blockwise_mm_baseline_shard_intermediate"),
        ("nkilib.core.utils.common_types", "ExpertAffinityScaleMode"),
        ("torch_neuronx:wrap_nki", "wrap_nki"),
        ("torch_neuronx:nki_op", "nki_op"),
    ],
)
def test_probe_names_what_an_nki_library_lacks(monkeypatch, missing, named):
    stand_ins.install(monkeypatch, leave_out=(missing,))
    reason = probe_nki()
    assert reason is not None and named in reason and "backend.kernels=portable" in reason


def test_probe_refuses_a_kernel_without_the_arguments_the_launch_passes(monkeypatch):
    def older_kernel(
        hidden_states, expert_affinities_masked, gate_up_proj_weight, down_proj_weight, block_size, token_position_to_id, block_to_expert
    ):
        """bwmm_shard_on_I's kernel before activation checkpoints."""

    older = stand_ins.StandInKernel(older_kernel, stand_ins.FORWARD.run, stand_ins.FORWARD.shapes)
    stand_ins.install(monkeypatch, kernels={"forward": older})
    reason = probe_nki()
    assert reason is not None and "checkpoint_activation" in reason and "expert_affinities_scaling_mode" in reason


def test_probe_refuses_a_torch_neuronx_without_nki_v2(monkeypatch):
    stand_ins.install(monkeypatch, nki_v2=False)
    reason = probe_nki()
    assert reason is not None and "torch_neuronx.nki_kernel.IS_NKI_V2_AVAILABLE is False" in reason and "NotImplementedError" in reason


def test_nki_refuses_before_any_worker_where_the_library_lacks_a_kernel(monkeypatch, neuron_stack, tmp_path):
    stand_ins.install(monkeypatch, leave_out=("nkilib.experimental.moe.bwd.blockwise_mm_backward",))
    done = command_in_process([*SEED, "backend.kernels=nki", "mode=plan"], tmp_path / "nki")
    assert done.returncode == 2, done.stderr
    assert "backend.kernels:" in done.stderr and "blockwise_mm_bwd" in done.stderr
    assert not (tmp_path / "nki").exists() or not any((tmp_path / "nki").iterdir())


def test_kernels_auto_on_neuron_picks_grouped_mm_where_nki_could_run(neuron_stack, tmp_path):
    """AWS measured torch._grouped_mm (dynamic NKI kernels) fastest for its Neuron 2.34 MoE recipes."""
    assert KERNELS["nki"].unavailable_reason() is None
    prepared = prepare(to_run_config(compose_config([*SEED, "mode=plan"], tmp_path / "auto")))
    assert prepared.trainer_config.metrics.run_info["kernel"] == "grouped_mm"
    prepared = prepare(to_run_config(compose_config([*SEED, "backend.kernels=nki", "mode=plan"], tmp_path / "nki")))
    assert prepared.trainer_config.metrics.run_info["kernel"] == "nki"


def test_nki_at_one_logical_core_exits_2_naming_the_second_shard(neuron_stack, tmp_path):
    args = [*SEED, "backend.kernels=nki", "mode=plan", "+launcher.env.NEURON_LOGICAL_NC_CONFIG=1"]
    done = command_in_process(args, tmp_path / "nki")
    assert done.returncode == 2, done.stderr
    assert "NEURON_LOGICAL_NC_CONFIG=1" in done.stderr and "compute_down_proj_shard_on_intermediate" in done.stderr


# --------------------------------------------------------------------------- kernel limits
VALID = {"dim": 2048, "hidden_dim": 768, "num_experts": 64, "logical_cores": 2, "tokens": 16384}


@pytest.mark.parametrize(
    "change,words",
    [
        ({"dim": 256}, "dim (H) = 256"),
        ({"dim": 8704}, "dim (H) = 8704"),
        ({"dim": 2560 + 256}, "multiple of 512"),
        ({"hidden_dim": 776}, "multiple of 16"),
        ({"hidden_dim": 784}, "over 2 logical core(s) must be a multiple of 32"),
        ({"logical_cores": 4}, "NEURON_LOGICAL_NC_CONFIG=4"),
        ({"logical_cores": 1}, "NEURON_LOGICAL_NC_CONFIG=1: the forward kernel needs 2 logical NeuronCores"),
        ({"num_experts": 4}, "documented 8-64"),
        ({"num_experts": 128}, "documented 8-64"),
        ({"tokens": 32 * 1024 + 1}, "32K tokens per call"),
    ],
)
def test_each_kernel_limit_is_checked_with_its_source(change, words):
    assert check_nki_moe_shapes(VALID) is None
    reason = check_nki_moe_shapes({**VALID, **change})
    assert reason is not None and words in reason and "nkilib/" in reason


def test_block_size_limits_come_from_both_kernels():
    sources = {limit.source.split(" ")[0] for limit in NKI_KERNEL_LIMITS}
    assert sources == {"nkilib/core/moe/moe_cte/bwmm_shard_on_I.py", "nkilib/experimental/moe/bwd/moe_bwd_parameters.py"}
    for block, holds in ((128, False), (256, True), (512, True), (1024, True), (768, False), (2048, False)):
        shape = nki_moe.NkiMoeShape(dim=2048, hidden_dim=768, num_experts=64, block_size=block)
        assert all(limit.holds(shape) for limit in NKI_KERNEL_LIMITS) == holds, block


@pytest.mark.parametrize(
    "degrees,words",
    [
        (["parallelism.tp=8", "parallelism.dp_shard=8"], "hidden_dim (I) on a rank = 96"),
        (["model.num_experts=128"], "128 expert(s) per rank"),
        (["training.seq_len=2048", "training.local_batch_size=8"], "65536 rows per call"),
    ],
)
def test_plan_checks_the_limits_on_one_ranks_shapes(neuron_stack, tmp_path, degrees, words):
    """The seed's shapes pass globally; sharded or batched like this one rank's call breaks a limit."""
    overrides = [*SEED, "backend.kernels=nki", "mode=plan", "launcher.nproc_per_node=64", *degrees]
    with pytest.raises(ConfigError) as info:
        execute(compose_config(overrides, tmp_path / "run"))
    assert info.value.key == "backend.kernels" and words in str(info.value), str(info.value)


def test_plan_exits_2_with_one_paragraph_naming_the_limit(neuron_stack, tmp_path):
    done = command_in_process(
        [*SEED, "backend.kernels=nki", "mode=plan", "launcher.nproc_per_node=64", "model.num_experts=128"], tmp_path / "run"
    )
    assert done.returncode == 2, done.stderr
    assert "backend.kernels: with tp=1, cp=1, ep=1" in done.stderr and "bwmm_shard_on_I.py" in done.stderr


# --------------------------------------------------------------------------- launches
def _inputs(rows_per_expert=(5, 0, 9, 3, 0, 7, 1, 2), seed=0):
    generator = torch.Generator().manual_seed(seed)
    counts = torch.tensor(rows_per_expert)
    rows = int(counts.sum())
    x = torch.randn(rows, D, generator=generator)
    weights = [torch.randn(*shape, generator=generator) * 0.05 for shape in ((E, F, D), (E, D, F), (E, F, D))]
    return x, weights, counts


def test_launches_pass_a_tuple_grid_and_hashable_constants_to_launchers_built_once(nki_on_cpu):
    x, weights, counts = _inputs()
    op, backward = KERNELS["nki"].op, KERNELS["nki"].backward_op
    grad = torch.randn(x.shape[0], D, generator=torch.Generator().manual_seed(1))
    for _ in range(2):
        out, gate, up = op(x, *weights, counts)
        grads = backward(grad, x, *weights, counts, gate, up, out)
    assert nki_on_cpu.wraps == ["blockwise_mm_baseline_shard_intermediate", "blockwise_mm_bwd"]
    assert {grid for _, grid in nki_on_cpu.launches} == {(stand_ins.LNC,)}
    want = KERNELS["grouped_mm"].op(x, *weights, counts)
    want_grads = KERNELS["grouped_mm"].backward_op(grad, x, *weights, counts, *want[1:], want[0])
    for got, expected in zip((out, gate, up, *grads), (*want, *want_grads)):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_nki_operators_pass_opcheck(nki_on_cpu):
    x, weights, counts = _inputs()
    out, gate, up = KERNELS["nki"].op(x, *weights, counts)
    for op, args in (
        (KERNELS["nki"].op, (x, *weights, counts)),
        (KERNELS["nki"].backward_op, (torch.randn_like(out), x, *weights, counts, gate, up, out)),
    ):
        torch.library.opcheck(op, args)


def test_expert_module_compiles_fullgraph_forward_and_backward(nki_on_cpu):
    x, weights, counts = _inputs()
    module = KernelGroupedExperts(KernelGroupedExperts.Config(dim=D, hidden_dim=F, num_experts=E, kernel="nki"))
    with torch.no_grad():
        for param, weight in zip((module.w1_EFD, module.w2_EDF, module.w3_EFD), weights):
            param.copy_(weight)
    grad = torch.randn(x.shape[0], D, generator=torch.Generator().manual_seed(1))

    def step(fn):
        module.zero_grad(set_to_none=True)
        rows = x.clone().requires_grad_()
        fn(rows, counts).backward(grad)
        return [rows.grad, *(p.grad for p in (module.w1_EFD, module.w2_EDF, module.w3_EFD))]

    eager = step(module)
    torch._dynamo.reset()
    nki_on_cpu.launches.clear()
    compiled = step(torch.compile(module, backend="aot_eager", fullgraph=True))
    for got, want in zip(compiled, eager):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert {name for name, _ in nki_on_cpu.launches} == {"blockwise_mm_baseline_shard_intermediate", "blockwise_mm_bwd"}


# --------------------------------------------------------------------------- goldens
# nki-library test/integration/nkilib/experimental/moe/test_bwmm_bwd_common.py: the numpy goldens
# of the forward with activation checkpoints (_generate_fwd_golden, SiLU, no bias, no clamps,
# tokens not skipped) and of blockwise_mm_bwd (_generate_bwd_golden), rewritten here from it.
def expit(x):
    return 1 / (1 + np.exp(-x))


def _silu(x):
    return x * expit(x)


def golden_forward(hidden, affinities, gate_up_w, down_w, token_position_to_id, block_to_expert, block):
    rows_plus_one, dim = hidden.shape
    experts, _, _, inter = gate_up_w.shape
    blocks = block_to_expert.shape[0]
    positions = token_position_to_id.reshape(blocks, block)
    output = np.zeros((rows_plus_one, dim), dtype=np.float32)
    gate_up_T = np.zeros((blocks, 2, inter, block), dtype=np.float32)
    down = np.zeros((blocks, block, dim), dtype=np.float32)
    weights = gate_up_w.reshape(experts, dim, 2 * inter)
    for b in range(blocks):
        ids, expert = positions[b], int(block_to_expert[b])
        projected = (hidden[ids] @ weights[expert]).reshape(block, 2, inter)
        gate_up_T[b] = projected.transpose(1, 2, 0)
        down[b] = (_silu(projected[:, 0]) * projected[:, 1]) @ down_w[expert]
        output[ids] += down[b] * affinities[ids, expert][:, None]
    return output, gate_up_T, down


def golden_backward(grad_out, hidden, affinities, gate_up_w, down_w, gate_up_T, down, token_position_to_id, block_to_expert, block):
    experts, inter, dim = down_w.shape
    blocks = block_to_expert.shape[0]
    positions = token_position_to_id.reshape(blocks, block)
    hidden_grad, affinity_grad = np.zeros_like(hidden), np.zeros_like(affinities)
    gate_up_grad, down_grad = np.zeros_like(gate_up_w), np.zeros_like(down_w)
    for b in range(blocks):
        ids, expert = positions[b], int(block_to_expert[b])
        upstream = grad_out[ids]
        affinity_grad[ids, expert] = np.sum(upstream * down[b], axis=1)
        down_out_grad = upstream * affinities[ids, expert][:, None]
        gate, up = gate_up_T[b][0].T, gate_up_T[b][1].T
        down_grad[expert] += (_silu(gate) * up).T @ down_out_grad
        h_grad = down_out_grad @ down_w[expert].T
        gate_grad = h_grad * up * expit(gate) * (1 + gate * (1 - expit(gate)))
        both = np.concatenate([gate_grad, h_grad * _silu(gate)], axis=-1)
        gate_up_grad[expert] += (hidden[ids].T @ both).reshape(dim, 2, inter)
        hidden_grad[ids] += both @ gate_up_w[expert].reshape(dim, 2 * inter).T
    return hidden_grad, affinity_grad, gate_up_grad, down_grad


def golden_style_routing(tokens, top_k, experts, block, rng):
    """test_bwmm_bwd_common.py's get_n_blocks / generate_token_position_to_id_and_experts:
    top_k distinct experts per token, ceil blocks per expert, padding blocks to the last expert."""
    blocks = math.ceil((tokens * top_k - (experts - 1)) / block) + experts - 1
    router = np.stack([rng.choice(experts, top_k, replace=False) for _ in range(tokens)])
    token_experts = np.zeros((tokens, experts))
    for k in range(top_k):
        token_experts += router[:, k : k + 1] == np.arange(experts)[None]
    per_expert = np.ceil(token_experts.sum(0) / block).astype(np.int64)
    per_expert[-1] += blocks - per_expert.sum()
    offsets = np.concatenate([[0], np.cumsum(per_expert)[:-1]]) * block
    token_position_to_id = np.full(blocks * block, tokens, dtype=np.int32)
    block_to_expert = np.repeat(np.arange(experts), per_expert).astype(np.int32)
    for e in range(experts):
        ids = np.nonzero(token_experts[:, e])[0]
        token_position_to_id[offsets[e] : offsets[e] + len(ids)] = ids
    return token_experts, token_position_to_id, block_to_expert


def _compare(reference_outputs, golden_outputs):
    """Both sides compute in fp32, summing in different orders: the absolute tolerance scales
    with each tensor's largest value (a weight gradient sums over every row of its expert). A
    layout fault (a wrong expert, row or padding) is off by the values themselves."""
    for got, want in zip(reference_outputs, golden_outputs):
        atol = 1e-5 * max(1.0, float(np.abs(want).max()))
        np.testing.assert_allclose(got.double().numpy().reshape(want.shape), want, rtol=1e-4, atol=atol)


def _reference_vs_golden(hidden, affinities, gate_up_w, down_w, token_position_to_id, block_to_expert, block, grad_out):
    to_torch = lambda a: torch.from_numpy(np.ascontiguousarray(a))  # noqa: E731
    routing = {"token_position_to_id": to_torch(token_position_to_id), "block_to_expert": to_torch(block_to_expert).reshape(-1, 1)}
    tensors = {
        "hidden_states": to_torch(hidden),
        "expert_affinities_masked": to_torch(affinities).reshape(-1, 1),
        "gate_up_proj_weight": to_torch(gate_up_w),
        "down_proj_weight": to_torch(down_w),
    }
    out, gate_up_T, down = blockwise_moe_reference(**tensors, **routing, block_size=block)
    golden = golden_forward(hidden, affinities, gate_up_w, down_w, token_position_to_id, block_to_expert, block)
    _compare((out, gate_up_T, down), golden)
    grads = blockwise_moe_backward_reference(
        **tensors,
        gate_up_proj_act_checkpoint_T=gate_up_T,
        down_proj_act_checkpoint=down,
        output_hidden_states_grad=to_torch(grad_out),
        **routing,
        block_size=block,
    )
    golden_grads = golden_backward(
        grad_out, hidden, affinities, gate_up_w, down_w, *golden[1:], token_position_to_id, block_to_expert, block
    )
    _compare(grads, golden_grads)


def test_reference_math_matches_nki_library_goldens_on_their_inputs():
    """Top-2 routing with random affinities, as the goldens' own inputs (build_bwmm_bwd_inputs)."""
    rng = np.random.default_rng(0)
    tokens, top_k, experts, block, dim, inter = 20, 2, 4, 8, 32, 16
    token_experts, token_position_to_id, block_to_expert = golden_style_routing(tokens, top_k, experts, block, rng)
    affinities = np.zeros((tokens + 1, experts), dtype=np.float32)
    affinities[:tokens] = rng.random((tokens, experts)) * token_experts
    hidden = rng.random((tokens + 1, dim), dtype=np.float32)
    hidden[tokens] = 0
    grad_out = rng.uniform(-1, 1, (tokens + 1, dim)).astype(np.float32)
    grad_out[tokens] = 0
    gate_up_w = rng.uniform(-0.1, 0.1, (experts, dim, 2, inter)).astype(np.float32)
    down_w = rng.uniform(-0.1, 0.1, (experts, inter, dim)).astype(np.float32)
    _reference_vs_golden(hidden, affinities, gate_up_w, down_w, token_position_to_id, block_to_expert, block, grad_out)


def test_reference_math_matches_nki_library_goldens_on_the_projects_layouts():
    """The kernel inputs the nki launch builds from torchtitan's rows and weights."""
    x, (w1, w2, w3), counts = _inputs()
    block = 16
    routing = layouts.blockwise_routing(counts, num_rows=x.shape[0], block_size=block)
    hidden = layouts.hidden_with_padding_row(x).numpy()
    affinities = layouts.row_expert_affinities(routing, E, x.dtype).reshape(-1, E).numpy()
    grad_out = layouts.hidden_with_padding_row(torch.randn(x.shape, generator=torch.Generator().manual_seed(1))).numpy()
    gate_up_w, down_w = layouts.gate_up_from_w1_w3(w1, w3).numpy(), layouts.down_from_w2(w2).numpy()
    token_position_to_id = routing.token_position_to_id.numpy()
    block_to_expert = routing.block_to_expert.flatten().numpy()
    _reference_vs_golden(hidden, affinities, gate_up_w, down_w, token_position_to_id, block_to_expert, block, grad_out)
