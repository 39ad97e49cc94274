"""Stand-ins for the Neuron stack the ``nki`` kernel calls, each following a public vendor source.

Nothing here runs NKI: the kernels compute the project's torch references of their math
(``blockwise_moe_reference``/``blockwise_moe_backward_reference``, checked against
nki-library's numpy goldens in test_nki_seams.py). What the stand-ins keep from the sources is
what the project's code must get right to run there:

* ``nki_op`` — torch-neuronx ``torch_neuronx/nki_hop.py`` (public mirror
  parmoham-aws/test-repo-parmoham, April 2026): ``torch.library.custom_op`` over a function
  run with the HOP bypassed, the schema inferred from the function, ``register_fake(fn)`` (the
  function is its own fake kernel) and a ``FunctionalTensorMode`` decomposition that runs it.
* ``wrap_nki`` — the same file: reads the kernel's ``.sign`` and ``.func``; the caller's
  ``__getitem__`` does ``tuple(map(int, grid))``; ``__call__`` binds positional arguments by
  the signature's names, adds keyword arguments and the defaults, and keeps only the
  signature's names. The launch splits tensors from constants and hashes the constants, which
  torch-neuronx's ``nki_kernel.py`` (``_return_shape_dtype_or_hashable``) refuses when one is
  not ``Hashable``. The launch itself is an operator in the graph (the HOP
  ``nki_kernel_wrapper``) whose fake returns the kernel's output shapes.
* ``get_logical_neuron_cores`` — ``torch_neuronx/utils.py``: the env value, a string.
* ``IS_NKI_V2_AVAILABLE`` — ``torch_neuronx/nki_kernel.py``: True where nki's V2 front end
  (``nki.compiler.backends.neuron.FrameworkKernel``) imports; else ``UnifiedKernelV2`` is a
  placeholder that raises NotImplementedError when the first launch builds it.
* The kernels — aws-neuron/nki-library: ``blockwise_mm_baseline_shard_intermediate``
  (``nkilib/core/moe/moe_cte/bwmm_shard_on_I.py``: signature, returns,
  ``check_blockwise_mm_shard_I_kernel_compatibility`` and the two shards
  ``compute_down_proj_shard_on_intermediate`` exchanges blocks between), ``blockwise_mm_bwd``
  (``nkilib/experimental/moe/bwd/blockwise_mm_backward.py`` with ``MOEBwdParameters.validate``
  and ``validate_sharding`` of ``moe_bwd_parameters.py``), ``ExpertAffinityScaleMode``
  (``nkilib/core/utils/common_types.py``).
"""

from __future__ import annotations

import enum
import inspect
import sys
import types
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._library.infer_schema import infer_schema
from torch._subclasses.fake_tensor import FakeTensor
from torch._subclasses.functional_tensor import FunctionalTensor, FunctionalTensorMode

from qwen3_trn.kernels.nki_moe import blockwise_moe_backward_reference, blockwise_moe_reference

LNC = 2


class ExpertAffinityScaleMode(enum.Enum):
    NO_SCALE = 0
    POST_SCALE = 1
    PRE_SCALE = 2
    PRE_SCALE_DELAYED = 3


class KernelAssertionError(AssertionError):
    """nki-library's ``kernel_assert`` failing."""


def kernel_assert(condition: bool, message: str) -> None:
    if not condition:
        raise KernelAssertionError(message)


@dataclass
class StandInKernel:
    """An ``@nki.jit`` kernel as wrap_nki sees it: ``.func`` and ``.sign``; ``run`` computes
    its outputs on real tensors and ``shapes`` their (shape, dtype) from the inputs."""

    func: Callable[..., Any]
    run: Callable[..., tuple[torch.Tensor, ...]]
    shapes: Callable[..., list[tuple[tuple[int, ...], torch.dtype]]]
    sign: inspect.Signature = field(init=False)

    def __post_init__(self) -> None:
        self.sign = inspect.signature(self.func)

    @property
    def __name__(self) -> str:
        return self.func.__name__


# --------------------------------------------------------------------------- nki-library kernels
def blockwise_mm_baseline_shard_intermediate(
    hidden_states,
    expert_affinities_masked,
    gate_up_proj_weight,
    down_proj_weight,
    block_size,
    token_position_to_id,
    block_to_expert,
    gate_and_up_proj_bias=None,
    down_proj_bias=None,
    gate_up_proj_scale=None,
    down_proj_scale=None,
    activation_function=None,
    skip_dma=None,
    compute_dtype=None,
    is_tensor_update_accumulating=True,
    expert_affinities_scaling_mode=ExpertAffinityScaleMode.PRE_SCALE,
    gate_clamp_upper_limit=None,
    gate_clamp_lower_limit=None,
    up_clamp_lower_limit=None,
    up_clamp_upper_limit=None,
    checkpoint_activation=False,
    expert_affinity_multiply_on_I=False,
):
    """Signature of bwmm_shard_on_I.py's kernel (the defaults that are NKI objects as None)."""


def _dtype_checks(args: dict[str, Any], floats: tuple[str, ...]) -> None:
    """bwmm_shard_on_I.py's notes: one floating dtype for all tensors, int32 routing tensors."""
    kernel_assert(len({args[name].dtype for name in floats}) == 1, "all input/output tensors must have the same floating point dtype")
    for name in ("token_position_to_id", "block_to_expert"):
        kernel_assert(args[name].dtype == torch.int32, f"{name} must be nl.int32")
    kernel_assert(tuple(args["block_to_expert"].shape[1:]) == (1,), "block_to_expert is [N, 1]")


def _forward_checks(args: dict[str, Any], logical_cores: int) -> None:
    _dtype_checks(args, ("hidden_states", "expert_affinities_masked", "gate_up_proj_weight", "down_proj_weight"))
    rows_plus_one, dim = args["hidden_states"].shape
    hidden = args["down_proj_weight"].shape[1]
    block = args["block_size"]
    kernel_assert(block % 256 == 0, "Blocksize must be a multiple of 256")
    kernel_assert(512 <= dim <= 8192, f"Hidden dims must be between 512 and 8192, found {dim}")
    kernel_assert(dim % 512 == 0, f"Hidden dim size must be multiples of 512, found {dim}")
    kernel_assert(hidden % 16 == 0, f"down_proj_weight I must be divisible by 16, found {hidden}")
    kernel_assert(logical_cores in (1, 2), "unsupported NUM_SHARDS")
    # compute_down_proj_shard_on_intermediate exchanges each block with shard ``1 - shard_id`` and
    # indexes its tiles: with one shard the trace reaches past the block's tiles to a shard that is not there.
    kernel_assert(logical_cores == 2, "compute_down_proj_shard_on_intermediate: sendrecv to rank 1 - shard_id needs 2 shards")
    # The project's launch asks for the outputs its backward needs, scaled as moe_cte does.
    kernel_assert(args["checkpoint_activation"] and not args["expert_affinity_multiply_on_I"], "project launch: checkpoints on H")
    kernel_assert(args["expert_affinities_scaling_mode"] is ExpertAffinityScaleMode.POST_SCALE, "project launch: POST_SCALE")


def _forward_run(args: dict[str, Any], logical_cores: int) -> tuple[torch.Tensor, ...]:
    _forward_checks(args, logical_cores)
    names = ("hidden_states", "expert_affinities_masked", "gate_up_proj_weight", "down_proj_weight")
    names += ("token_position_to_id", "block_to_expert", "block_size")
    return blockwise_moe_reference(**{name: args[name] for name in names})


def _forward_shapes(args: dict[str, Any], logical_cores: int) -> list[tuple[tuple[int, ...], torch.dtype]]:
    _forward_checks(args, logical_cores)
    hidden_states, gate_up = args["hidden_states"], args["gate_up_proj_weight"]
    block, hidden, dim = args["block_size"], args["down_proj_weight"].shape[1], hidden_states.shape[1]
    blocks = args["token_position_to_id"].shape[0] // block
    return [
        (tuple(hidden_states.shape), hidden_states.dtype),
        ((blocks, 2, hidden, block), gate_up.dtype),
        ((blocks, block, dim), args["down_proj_weight"].dtype),
    ]


def blockwise_mm_bwd(
    hidden_states,
    expert_affinities_masked,
    gate_up_proj_weight,
    down_proj_weight,
    gate_up_proj_act_checkpoint_T,
    down_proj_act_checkpoint,
    token_position_to_id,
    block_to_expert,
    output_hidden_states_grad,
    block_size,
    skip_dma=None,
    compute_dtype=None,
    is_tensor_update_accumulating=True,
    shard_option=None,
    affinity_option=None,
    kernel_type_option=None,
    clamp_limits=None,
    bias=False,
    activation_type=None,
    block_tile_size=None,
):
    """Signature of blockwise_mm_backward.py's kernel (enum defaults as None)."""


def _backward_checks(args: dict[str, Any], logical_cores: int) -> None:
    floats = ("hidden_states", "expert_affinities_masked", "gate_up_proj_weight", "down_proj_weight", "gate_up_proj_act_checkpoint_T")
    _dtype_checks(args, (*floats, "down_proj_act_checkpoint", "output_hidden_states_grad"))
    dim = args["hidden_states"].shape[1]
    hidden = args["down_proj_weight"].shape[1]
    kernel_assert(args["block_size"] in (128, 256, 512, 1024), f"block_size must be 128, 256, 512, or 1024, got {args['block_size']}")
    kernel_assert(hidden % 2 == 0 and dim % 2 == 0, "I_TP and H must be divisible by 2")
    kernel_assert(dim % logical_cores == 0, f"Hidden dim H={dim} must be divisible by num_shards={logical_cores}")
    kernel_assert((dim // logical_cores) % 32 == 0, "H dim when sharded must be divisible by 32 for DMA transpose")
    kernel_assert((hidden // logical_cores) % 32 == 0, "I_TP dim when sharded must be divisible by 32 for DMA transpose")


def _backward_run(args: dict[str, Any], logical_cores: int) -> tuple[torch.Tensor, ...]:
    _backward_checks(args, logical_cores)
    names = ("hidden_states", "expert_affinities_masked", "gate_up_proj_weight", "down_proj_weight", "gate_up_proj_act_checkpoint_T")
    names += ("down_proj_act_checkpoint", "token_position_to_id", "block_to_expert", "output_hidden_states_grad", "block_size")
    return blockwise_moe_backward_reference(**{name: args[name] for name in names})


def _backward_shapes(args: dict[str, Any], logical_cores: int) -> list[tuple[tuple[int, ...], torch.dtype]]:
    _backward_checks(args, logical_cores)
    names = ("hidden_states", "expert_affinities_masked", "gate_up_proj_weight", "down_proj_weight")
    return [(tuple(args[name].shape), args[name].dtype) for name in names]


FORWARD = StandInKernel(blockwise_mm_baseline_shard_intermediate, _forward_run, _forward_shapes)


# nkilib/core/moe/moe_cte/moe_cte.py: the unified entry point takes its implementation's
# settings as one spec, a mutable (so unhashable) dataclass.
class MoECTEImplementation(enum.Enum):
    shard_on_block = 0
    shard_on_i = 1


@dataclass
class ShardOnIConfig:
    checkpoint_activation: bool = False
    expert_affinity_multiply_on_I: bool = False
    num_static_block: int | None = None


@dataclass
class MoECTESpec:
    implementation: MoECTEImplementation
    shard_on_block: Any = None
    shard_on_I: ShardOnIConfig | None = None


def moe_cte(
    hidden_states,
    expert_affinities_masked,
    gate_up_proj_weight,
    down_proj_weight,
    token_position_to_id,
    block_to_expert,
    block_size,
    spec,
    conditions=None,
    expert_affinities_scaling_mode=ExpertAffinityScaleMode.POST_SCALE,
):
    """moe_cte's leading parameters (the rest left out)."""


def _moe_cte_args(args: dict[str, Any]) -> dict[str, Any]:
    spec = args["spec"]
    kernel_assert(spec.implementation is MoECTEImplementation.shard_on_i, "stand-in: shard_on_i only")
    config = spec.shard_on_I or ShardOnIConfig()
    fields_ = {"checkpoint_activation": config.checkpoint_activation, "expert_affinity_multiply_on_I": config.expert_affinity_multiply_on_I}
    return {**args, **fields_}


MOE_CTE = StandInKernel(
    moe_cte,
    lambda args, lnc: _forward_run(_moe_cte_args(args), lnc),
    lambda args, lnc: _forward_shapes(_moe_cte_args(args), lnc),
)
BACKWARD = StandInKernel(blockwise_mm_bwd, _backward_run, _backward_shapes)


# --------------------------------------------------------------------------- torch-neuronx
@dataclass
class NeuronStack:
    """What the stand-in stack saw: kernels wrapped, grids, constants of every launch."""

    kernels: list[StandInKernel] = field(default_factory=list)
    constants: dict[int, dict[str, Any]] = field(default_factory=dict)
    wraps: list[str] = field(default_factory=list)
    launches: list[tuple[str, tuple[int, ...]]] = field(default_factory=list)

    def reset(self) -> None:
        for name, value in vars(NeuronStack()).items():
            setattr(self, name, value)

    def kernel_call(self, kernel_idx: int, grid: Sequence[int], constants_key: int, names: list[str], tensors: list[torch.Tensor]):
        kernel = self.kernels[kernel_idx]
        args = {**self.constants[constants_key], **dict(zip(names, tensors))}
        if any(isinstance(t, FakeTensor) or t.device.type == "meta" for t in tensors):
            return [torch.empty(shape, dtype=dtype, device=tensors[0].device) for shape, dtype in kernel.shapes(args, grid[0])]
        return list(kernel.run(args, grid[0]))


def _hashable_or_refused(value: Any, name: str) -> Any:
    """torch_neuronx/nki_kernel.py ``_return_shape_dtype_or_hashable`` for a constant."""
    if isinstance(value, str):
        return value
    if isinstance(value, Sequence):
        return tuple(_hashable_or_refused(v, f"{name}[{i}]") for i, v in enumerate(value))
    if isinstance(value, dict):
        return tuple((k, _hashable_or_refused(v, f"{name}[{k}]")) for k, v in sorted(value.items()))
    if not isinstance(value, Hashable):
        raise RuntimeError(f"sema.err_nki_param_not_hashable(name={name}, ty={type(value)})")
    return value


class NKIHOPCaller:
    """torch_neuronx/nki_hop.py ``NKIHOPCaller``."""

    def __init__(self, stack: NeuronStack, kernel_idx: int, grid: Sequence[int], arg_names: list[str], defaults: dict[str, Any]):
        self.stack, self.kernel_idx, self.grid = stack, kernel_idx, grid
        self.kernel_arg_names, self.kernel_default_args = arg_names, defaults

    def __getitem__(self, grid: Sequence[int]) -> NKIHOPCaller:
        grid = tuple(map(int, grid))
        return NKIHOPCaller(self.stack, self.kernel_idx, grid, self.kernel_arg_names, self.kernel_default_args)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        combined = {**dict(zip(self.kernel_arg_names, args)), **kwargs}
        for name in self.kernel_arg_names:
            if name not in combined:
                combined[name] = self.kernel_default_args[name]
        ordered = [(name, combined[name]) for name in self.kernel_arg_names]
        tensors = [(name, value) for name, value in ordered if isinstance(value, torch.Tensor)]
        constants = {name: value for name, value in ordered if not isinstance(value, torch.Tensor)}
        key = hash(tuple((name, _hashable_or_refused(value, name)) for name, value in constants.items()))
        self.stack.constants[key] = constants
        kernel = self.stack.kernels[self.kernel_idx]
        self.stack.launches.append((kernel.__name__, self.grid))
        names = [name for name, _ in tensors]
        outputs = torch.ops.nki_stand_in.nki_kernel_wrapper(self.kernel_idx, list(self.grid), key, names, [t for _, t in tensors])
        return tuple(outputs)


def _define_kernel_wrapper(stack: NeuronStack) -> Any:
    """The HOP ``nki_kernel_wrapper`` as an operator: the graph keeps the launch, its fake gives
    the kernel's output shapes (nki_hop.py's FakeTensorMode implementation)."""
    library = torch.library.Library("nki_stand_in", "FRAGMENT")
    library.define("nki_kernel_wrapper(int kernel_idx, int[] grid, int constants_key, str[] names, Tensor[] tensors) -> Tensor[]")
    library.impl("nki_kernel_wrapper", stack.kernel_call, "CPU")
    torch.library.register_fake("nki_stand_in::nki_kernel_wrapper", stack.kernel_call, lib=library)
    return library


def nki_op(name: str, fn: Callable | None = None, mutates_args: Any = {}) -> Callable:  # noqa: B006 - the source's signature
    """torch_neuronx/nki_hop.py ``nki_op``."""

    def dec(fn: Callable) -> Any:
        def backend_fn(*args: Any, **kwargs: Any) -> Any:
            return fn(*args, **kwargs)

        result = torch.library.custom_op(name, backend_fn, mutates_args=mutates_args, schema=infer_schema(fn, mutates_args=mutates_args))
        result.register_fake(fn)

        def functional_decomp(mode, op, types_, args, kwargs):
            known = (torch.Tensor, FunctionalTensor)
            if [t for t in types_ if not issubclass(t, FakeTensor) and t not in known]:
                return NotImplemented
            with mode:
                return fn(*args, **kwargs)

        result.register_torch_dispatch(FunctionalTensorMode, functional_decomp)
        return result

    return dec if fn is None else dec(fn)


def install(
    monkeypatch: Any, *, leave_out: tuple[str, ...] = (), kernels: dict[str, StandInKernel] | None = None, nki_v2: bool = True
) -> NeuronStack:
    """Put the stand-in modules in ``sys.modules``; ``leave_out``: ``module`` or ``module:attr``
    to leave missing (an nki-library without that kernel); ``kernels``: other kernel versions;
    ``nki_v2``: torch-neuronx's ``IS_NKI_V2_AVAILABLE``."""
    stack = _ACTIVE
    stack.reset()
    chosen = {"forward": FORWARD, "backward": BACKWARD, **(kernels or {})}

    def wrap_nki(nki_kernel: StandInKernel, **kwargs: Any) -> NKIHOPCaller:
        sig = nki_kernel.sign
        arg_names = list(sig.parameters)
        defaults = {n: p.default for n, p in sig.parameters.items() if p.default is not inspect.Parameter.empty}
        stack.wraps.append(nki_kernel.__name__)
        stack.kernels.append(nki_kernel)
        return NKIHOPCaller(stack, len(stack.kernels) - 1, [], arg_names, defaults)

    if not _LIBRARIES:
        _LIBRARIES.append(_define_kernel_wrapper(stack))
    modules = {
        "nki": {},
        "torch_neuronx": {"nki_op": nki_op, "wrap_nki": wrap_nki},
        "torch_neuronx.utils": {"get_logical_neuron_cores": lambda: str(LNC)},
        # torch_neuronx/nki_kernel.py: True where ``nki.compiler.backends.neuron.FrameworkKernel`` imports
        "torch_neuronx.nki_kernel": {"IS_NKI_V2_AVAILABLE": nki_v2},
        "nkilib": {},
        "nkilib.core": {},
        "nkilib.core.utils": {},
        "nkilib.core.utils.common_types": {"ExpertAffinityScaleMode": ExpertAffinityScaleMode},
        "nkilib.core.moe": {},
        "nkilib.core.moe.moe_cte": {},
        "nkilib.core.moe.moe_cte.moe_cte": {
            "moe_cte": MOE_CTE,
            "MoECTESpec": MoECTESpec,
            "MoECTEImplementation": MoECTEImplementation,
            "ShardOnIConfig": ShardOnIConfig,
        },
        "nkilib.core.moe.moe_cte.bwmm_shard_on_I": {"blockwise_mm_baseline_shard_intermediate": chosen["forward"]},
        "nkilib.experimental": {},
        "nkilib.experimental.moe": {},
        "nkilib.experimental.moe.bwd": {},
        "nkilib.experimental.moe.bwd.blockwise_mm_backward": {"blockwise_mm_bwd": chosen["backward"]},
    }
    for name, attrs in modules.items():
        if name in leave_out:
            monkeypatch.setitem(sys.modules, name, None)  # import raises ModuleNotFoundError
            continue
        module = types.ModuleType(name)
        module.__dict__.update({k: v for k, v in attrs.items() if f"{name}:{k}" not in leave_out})
        monkeypatch.setitem(sys.modules, name, module)
    return stack


# One wrapper operator per process (torch.library names are global); it dispatches to the
# stack installed last.
_ACTIVE = NeuronStack()
_LIBRARIES: list[Any] = []
