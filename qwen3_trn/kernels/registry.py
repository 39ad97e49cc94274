"""The expert operator's kernels: named forward/backward pairs, chosen per device.

Each kernel (``ExpertKernel``, added by ``register_kernel``) becomes two ``torch.library``
operators, ``qwen3_trn::moe_swiglu_experts__<name>`` and ``..._backward__<name>``, sharing the
schemas, fake kernels and autograd formula here. One operator per kernel rather than a string
argument: the choice is made once, outside the traced region, and the NKI kernel must be built
by ``torch_neuronx.nki_op``.

``select_kernel`` resolves ``backend.kernels``: ``auto`` (the first kernel of ``DEVICE_KERNELS``
that can run), ``portable`` (the same without vendor kernels) or a name, which runs or raises
``KernelUnavailableError``; never a silent fallback.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

logger = logging.getLogger(__name__)

__all__ = [
    "AUTO",
    "DEVICE_KERNELS",
    "KERNELS",
    "OP_NAME",
    "PORTABLE",
    "ExpertKernel",
    "KernelUnavailableError",
    "register_kernel",
    "resolve_op",
    "select_kernel",
    "validate_request",
]

AUTO = "auto"
PORTABLE = "portable"
SELECTION_POLICIES = (AUTO, PORTABLE)
NAMESPACE = "qwen3_trn"
OP_NAME = "moe_swiglu_experts"
BACKWARD_OP_NAME = "moe_swiglu_experts_backward"
FORWARD_SCHEMA = "(Tensor x, Tensor w1, Tensor w2, Tensor w3, Tensor num_tokens_per_expert) -> (Tensor, Tensor, Tensor)"
BACKWARD_SCHEMA = (
    "(Tensor grad_out, Tensor x, Tensor w1, Tensor w2, Tensor w3, Tensor num_tokens_per_expert, "
    "Tensor gate, Tensor up, Tensor out) -> (Tensor, Tensor, Tensor, Tensor)"
)

# The kernels that run on each device type, in the order `auto` tries them: the measured fastest
# first (docs/moe-kernels.md); `padded_bmm` runs the widths `grouped_mm`'s stride rule refuses. On
# Trainium AWS measured torch._grouped_mm (torch-neuronx's dynamic NKI kernels) above the blockwise
# NKI MoE kernels and moved its Neuron 2.34 MoE recipes to it (about 1.3x the MFU of 2.33 for
# Qwen3-30B-A3B at TP4 x FSDP16); `nki` runs only where asked for by name.
DEVICE_KERNELS: dict[str, tuple[str, ...]] = {
    "neuron": ("grouped_mm", "nki"),
    "cpu": ("grouped_mm", "padded_bmm"),
    "cuda": ("grouped_mm", "padded_bmm"),
}

# None when the kernel can run here, else a sentence saying why not and how to fix it.
Probe = Callable[[], "str | None"]
# Receives one rank's shapes (kernels.moe.moe_problem); None when the kernel accepts them, else
# which limit fails.
ShapeCheck = Callable[[Mapping[str, int]], "str | None"]


class KernelUnavailableError(ValueError):
    """A requested kernel cannot run here; the message says why and how to fix it."""


@dataclass(eq=False)
class ExpertKernel:
    """One named implementation of the expert operator.

    ``probe``: for a kernel that needs a vendor library (run once per process; not portable).
    ``make_op(qualname, fn)``: builds the operators through a vendor API instead of
    ``torch.library.custom_op``; ``fn`` is then its own fake kernel."""

    name: str
    forward: Callable[..., Any]
    backward: Callable[..., Any]
    probe: Probe | None = None
    shape_check: ShapeCheck | None = None
    make_op: Callable[[str, Callable[..., Any]], Any] | None = None
    _built: bool = field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.name in SELECTION_POLICIES:
            raise ValueError(f"{self.name!r} is a selection policy, not a kernel name")
        if not self.name.isidentifier():
            raise ValueError(f"kernel name {self.name!r} must be a Python identifier")
        if self.probe is not None:
            self.probe = functools.cache(self.probe)  # probes import vendor modules

    @property
    def portable(self) -> bool:
        return self.probe is None

    @property
    def devices(self) -> list[str]:
        return sorted(device for device, names in DEVICE_KERNELS.items() if self.name in names)

    def unavailable_reason(self) -> str | None:
        return None if self.probe is None else self.probe()

    def unsupported_shape_reason(self, problem: Mapping[str, int] | None) -> str | None:
        return None if problem is None or self.shape_check is None else self.shape_check(problem)

    @property
    def op(self) -> torch._ops.OpOverload:
        """The forward operator, ``torch.ops.qwen3_trn.moe_swiglu_experts__<name>.default``."""
        return _overload(OP_NAME, self._build_ops())

    @property
    def backward_op(self) -> torch._ops.OpOverload:
        return _overload(BACKWARD_OP_NAME, self._build_ops())

    def _build_ops(self) -> str:
        # Both at once: a compiled backward loaded from torch.compile's cache calls the backward
        # operator without ever running the autograd formula.
        if not self._built:
            forward = self._custom_op(OP_NAME, self.forward, FORWARD_SCHEMA, _fake_forward)
            self._custom_op(BACKWARD_OP_NAME, self.backward, BACKWARD_SCHEMA, _fake_backward)
            forward.register_autograd(functools.partial(_backward, kernel=self.name), setup_context=_setup_context)
            self._built = True
        return self.name

    def _custom_op(self, op_name: str, fn: Callable[..., Any], schema: str, fake: Callable[..., Any]) -> Any:
        qualname = f"{NAMESPACE}::{op_name}__{self.name}"
        if self.make_op is not None:
            return self.make_op(qualname, fn)
        op = torch.library.custom_op(qualname, fn, mutates_args=(), schema=schema)
        op.register_fake(fake)
        return op


def _overload(op_name: str, kernel_name: str) -> torch._ops.OpOverload:
    return getattr(getattr(torch.ops, NAMESPACE), f"{op_name}__{kernel_name}").default


# --------------------------------------------------------------------------- the operator
def _fake_forward(x, w1, w2, w3, num_tokens_per_expert):
    rows, hidden = x.shape[0], w1.shape[1]
    return x.new_empty(rows, w2.shape[1]), x.new_empty(rows, hidden), x.new_empty(rows, hidden)


def _fake_backward(grad_out, x, w1, w2, w3, num_tokens_per_expert, gate, up, out):
    return torch.empty_like(x), torch.empty_like(w1), torch.empty_like(w2), torch.empty_like(w3)


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[Any, ...]) -> None:
    x, w1, w2, w3, num_tokens_per_expert = inputs
    out, gate, up = output
    ctx.mark_non_differentiable(gate, up)
    # `out` is kept for kernels that checkpoint the down projection (the NKI backward).
    ctx.save_for_backward(x, w1, w2, w3, num_tokens_per_expert, gate, up, out)


def _backward(ctx: Any, grad_out, _grad_gate, _grad_up, *, kernel: str):
    x, w1, w2, w3, num_tokens_per_expert, gate, up, out = ctx.saved_tensors
    backward = _overload(BACKWARD_OP_NAME, kernel)
    grad_x, grad_w1, grad_w2, grad_w3 = backward(grad_out.contiguous(), x, w1, w2, w3, num_tokens_per_expert, gate, up, out)
    return grad_x, grad_w1, grad_w2, grad_w3, None


# --------------------------------------------------------------------------- registry and selection
KERNELS: dict[str, ExpertKernel] = {}
_logged: set[tuple[str, ...]] = set()


def register_kernel(kernel: ExpertKernel) -> ExpertKernel:
    if kernel.name in KERNELS:
        raise ValueError(f"{OP_NAME!r} already has a kernel named {kernel.name!r}")
    KERNELS[kernel.name] = kernel
    return kernel


def _kernel(name: str) -> ExpertKernel:
    if name not in KERNELS:
        raise ValueError(f"unknown kernel {name!r} for op {OP_NAME!r}; choose one of {[*SELECTION_POLICIES, *sorted(KERNELS)]}")
    return KERNELS[name]


def validate_request(requested: str) -> None:
    """Refuse unknown kernel names at config time, whatever the device."""
    if requested not in SELECTION_POLICIES:
        _kernel(requested)


def select_kernel(requested: str, device_type: str, problem: Mapping[str, int] | None = None) -> ExpertKernel:
    """Resolve ``auto | portable | <name>`` for a device (and, given one rank's shapes, for them)."""
    if requested in SELECTION_POLICIES:
        return _select_by_policy(requested, device_type, problem)
    kernel = _kernel(requested)
    if device_type not in kernel.devices:
        raise KernelUnavailableError(
            f"kernel {requested!r} for {OP_NAME!r} runs on {kernel.devices}, not on {device_type!r}. "
            f"Use backend.kernels=auto, or one of {sorted(DEVICE_KERNELS.get(device_type, ()))} on {device_type!r}."
        )
    reason = kernel.unavailable_reason()
    if reason is not None:
        raise KernelUnavailableError(f"kernel {requested!r} for {OP_NAME!r} is unavailable: {reason}")
    reason = kernel.unsupported_shape_reason(problem)
    if reason is not None:
        raise KernelUnavailableError(
            f"kernel {requested!r} for {OP_NAME!r} does not support this model: {reason}. "
            "Use backend.kernels=portable or change the model shape."
        )
    return kernel


def _select_by_policy(policy: str, device_type: str, problem: Mapping[str, int] | None) -> ExpertKernel:
    skipped: list[str] = []
    for kernel in map(_kernel, DEVICE_KERNELS.get(device_type, ())):
        if policy == PORTABLE and not kernel.portable:
            continue
        reason = kernel.unavailable_reason() or kernel.unsupported_shape_reason(problem)
        if reason is None:
            message = (policy, OP_NAME, device_type, kernel.name, "; ".join(skipped))
            if skipped and message not in _logged:
                _logged.add(message)
                logger.info("kernels=%s for %s on %s chose %r; skipped %s", *message)
            return kernel
        skipped.append(f"{kernel.name}: {reason}")
    detail = "; ".join(skipped) or "no kernel is registered for this device"
    raise KernelUnavailableError(f"no {policy} kernel for {OP_NAME!r} can run on {device_type!r} ({detail})")


def resolve_op(requested: str, device_type: str, problem: Mapping[str, int] | None = None) -> torch._ops.OpOverload:
    """``select_kernel(...).op``, callable inside ``torch.compile``'d code without graph breaks."""
    problem_items = tuple(sorted(problem.items())) if problem is not None else None
    return _overload(OP_NAME, _resolved_kernel_name(requested, device_type, problem_items))


@torch.compiler.assume_constant_result
def _resolved_kernel_name(requested: str, device_type: str, problem_items: tuple[tuple[str, int], ...] | None) -> str:
    # Selection probes (imports) vendor modules, so torch.compile runs it eagerly and keeps only
    # its result, a constant string (operator objects cannot be guarded); the operators are
    # created here, outside the traced region.
    return select_kernel(requested, device_type, dict(problem_items) if problem_items is not None else None)._build_ops()
