"""Kernel registry: each operator is declared once, implementations are registered by name.

An operator is declared once (:class:`OpDeclaration`): its schema, its fake kernel (output
metadata for ``torch.compile``/meta tensors) and its autograd formula. Implementations
(``nki``, ``grouped_mm``, ``padded_bmm``, ...) are registered against it with
:func:`register_kernel`, each with the device types it runs on, an availability probe and a
priority used by ``auto``.

Every implementation becomes its own ``torch.library`` custom operator,
``qwen3_trn::<op>__<impl>``, sharing the declared schema, fake kernel and autograd formula.
Per-implementation operators (rather than one operator with a string argument) are used because:

* the choice is made once, outside the traced region, so a compiled graph holds exactly one
  opaque node for the kernel that really runs and no runtime lookup;
* an implementation may need a different operator *factory*: NKI kernels must be registered
  through ``torch_neuronx.nki_op`` (which traces the kernel's own Python body as its fake
  kernel), portable ones through ``torch.library.custom_op``.

Operators are created lazily on first use, so declaring an NKI implementation never imports
``torch_neuronx`` on machines that do not have it.

Selection (:func:`select_kernel`) takes the user-facing request ``auto | portable | <impl>``:

* ``auto``: the highest-priority implementation that supports the device, is available and
  accepts the problem's shapes (NKI where it can run, else the fastest portable one);
* ``portable``: the same, restricted to implementations that need no vendor library;
* ``<impl>`` (including ``nki``): exactly that implementation, or :class:`KernelUnavailableError`
  saying why it cannot run and how to fix it. There is never a silent fallback.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

logger = logging.getLogger(__name__)

__all__ = [
    "AUTO",
    "PORTABLE",
    "KernelChoice",
    "KernelImpl",
    "KernelRegistry",
    "KernelUnavailableError",
    "OpDeclaration",
    "KERNELS",
    "declare_op",
    "register_kernel",
    "resolve_op",
    "select_kernel",
]

AUTO = "auto"
PORTABLE = "portable"
SELECTION_POLICIES = (AUTO, PORTABLE)

# A probe returns None when the implementation can run, else a sentence saying why not.
Probe = Callable[[], "str | None"]
# A shape check receives the problem description (e.g. dim, hidden_dim) and returns None when
# the implementation supports it, else a sentence saying which constraint fails.
ShapeCheck = Callable[[Mapping[str, int]], "str | None"]
# An op factory turns (qualified name, eager function, declaration) into a torch custom op.
OpFactory = Callable[[str, Callable[..., Any], "OpDeclaration"], Any]


class KernelUnavailableError(ValueError):
    """A requested kernel cannot run here; the message says why and how to fix it."""


def always_available() -> str | None:
    return None


@dataclass(frozen=True)
class OpDeclaration:
    """The one declaration of an operator, shared by all of its implementations.

    ``schema`` is the ``torch.library`` schema without the name, e.g.
    ``"(Tensor x) -> Tensor"``. ``fake`` computes output metadata from fake inputs.
    ``backward(ctx, *grads, backward_kernel)`` is the autograd formula; it receives the
    implementation of ``backward_op`` whose name matches the forward implementation (so an NKI
    forward is differentiated by the NKI backward, a portable one by the same portable impl).
    """

    name: str
    schema: str
    fake: Callable[..., Any]
    setup_context: Callable[..., None] | None = None
    backward: Callable[..., Any] | None = None
    backward_op: str | None = None
    doc: str = ""

    def __post_init__(self) -> None:
        if (self.backward is None) != (self.setup_context is None):
            raise ValueError(f"op {self.name!r}: backward and setup_context go together")
        if self.backward is not None and self.backward_op is None:
            raise ValueError(f"op {self.name!r}: a backward formula needs backward_op")


def torch_custom_op(qualname: str, fn: Callable[..., Any], decl: OpDeclaration) -> Any:
    """Default factory: a plain ``torch.library.custom_op`` with the declared fake kernel."""
    op = torch.library.custom_op(qualname, fn, mutates_args=(), schema=decl.schema)
    op.register_fake(decl.fake)
    return op


@dataclass(eq=False)
class KernelImpl:
    """One implementation of a declared operator."""

    op_name: str
    name: str
    fn: Callable[..., Any]
    devices: frozenset[str]
    probe: Probe
    priority: Mapping[str, int]
    portable: bool
    shape_check: ShapeCheck | None
    op_factory: OpFactory
    _op: Any = field(default=None, repr=False)

    def priority_on(self, device_type: str) -> int:
        return self.priority.get(device_type, self.priority.get("*", 0))

    def unavailable_reason(self) -> str | None:
        return self.probe()

    def is_available(self) -> bool:
        return self.unavailable_reason() is None

    def unsupported_shape_reason(self, problem: Mapping[str, int] | None) -> str | None:
        if problem is None or self.shape_check is None:
            return None
        return self.shape_check(problem)


@dataclass(frozen=True)
class KernelChoice:
    """The outcome of :func:`select_kernel`: which implementation runs, and why."""

    op_name: str
    impl_name: str
    device_type: str
    requested: str
    registry: "KernelRegistry" = field(repr=False, compare=False)

    @property
    def op(self) -> torch._ops.OpOverload:
        """The operator of this implementation, ``torch.ops.<ns>.<op>__<impl>.default``."""
        return self.registry.op_overload(self.op_name, self.impl_name)

    @property
    def torch_op_name(self) -> str:
        """``<op>__<impl>``: the operator's name in ``torch.ops.<namespace>``."""
        return f"{self.op_name}__{self.impl_name}"

    def __call__(self, *args: Any) -> Any:
        return self.op(*args)


class KernelRegistry:
    """Declared operators and their implementations, under one ``torch.library`` namespace."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self._ops: dict[str, OpDeclaration] = {}
        self._impls: dict[str, dict[str, KernelImpl]] = {}
        self._logged: set[tuple[str, ...]] = set()

    # ---------------------------------------------------------------- declaration
    def declare_op(self, decl: OpDeclaration) -> OpDeclaration:
        if decl.name in self._ops:
            raise ValueError(f"op {decl.name!r} is already declared")
        self._ops[decl.name] = decl
        self._impls[decl.name] = {}
        return decl

    def register_kernel(
        self,
        op_name: str,
        impl_name: str,
        *,
        devices: Iterable[str],
        available: Probe = always_available,
        priority: int | Mapping[str, int] = 0,
        portable: bool = True,
        shape_check: ShapeCheck | None = None,
        op_factory: OpFactory = torch_custom_op,
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator registering ``fn`` as implementation ``impl_name`` of ``op_name``.

        ``priority`` is an int, or a mapping ``device_type -> int`` (key ``"*"`` for the rest),
        because the fastest portable kernel differs per device.
        """
        decl = self.declaration(op_name)
        if impl_name in SELECTION_POLICIES:
            raise ValueError(f"{impl_name!r} is a selection policy, not a kernel name")
        if not impl_name.isidentifier():
            raise ValueError(f"kernel name {impl_name!r} must be a Python identifier")
        priorities = {"*": priority} if isinstance(priority, int) else dict(priority)

        def decorator(fn: Callable[..., Any]) -> Callable[..., Any]:
            impls = self._impls[decl.name]
            if impl_name in impls:
                raise ValueError(f"{decl.name!r} already has a kernel named {impl_name!r}")
            impls[impl_name] = KernelImpl(
                op_name=decl.name,
                name=impl_name,
                fn=fn,
                devices=frozenset(devices),
                probe=_memoize_probe(available),
                priority=priorities,
                portable=portable,
                shape_check=shape_check,
                op_factory=op_factory,
            )
            return fn

        return decorator

    # ---------------------------------------------------------------- lookup
    def declaration(self, op_name: str) -> OpDeclaration:
        try:
            return self._ops[op_name]
        except KeyError:
            raise ValueError(f"unknown op {op_name!r}; declared ops: {sorted(self._ops)}") from None

    def impls(self, op_name: str) -> dict[str, KernelImpl]:
        self.declaration(op_name)
        return dict(self._impls[op_name])

    def impl(self, op_name: str, impl_name: str) -> KernelImpl:
        impls = self._impls[self.declaration(op_name).name]
        if impl_name not in impls:
            raise ValueError(f"unknown kernel {impl_name!r} for op {op_name!r}; choose one of {[*SELECTION_POLICIES, *sorted(impls)]}")
        return impls[impl_name]

    def validate_request(self, op_name: str, requested: str) -> None:
        """Device-independent check of a user request (unknown names fail at config time)."""
        if requested not in SELECTION_POLICIES:
            self.impl(op_name, requested)

    def custom_op(self, op_name: str, impl_name: str) -> Any:
        """The ``torch.library`` operator of one implementation, created on first use."""
        impl = self.impl(op_name, impl_name)
        if impl._op is None:
            impl._op = self._build_op(impl)
            backward_op = self._ops[op_name].backward_op
            if backward_op is not None:
                # Create the backward op now: a compiled backward loaded from torch.compile's
                # cache calls it without ever running the autograd formula that would create it.
                self.custom_op(backward_op, impl_name)
        return impl._op

    def op_overload(self, op_name: str, impl_name: str) -> torch._ops.OpOverload:
        """The implementation's operator as an ``OpOverload`` (what FX graphs record)."""
        self.custom_op(op_name, impl_name)
        return getattr(getattr(torch.ops, self.namespace), f"{op_name}__{impl_name}").default

    def _build_op(self, impl: KernelImpl) -> Any:
        decl = self._ops[impl.op_name]
        qualname = f"{self.namespace}::{impl.op_name}__{impl.name}"
        op = impl.op_factory(qualname, impl.fn, decl)
        if decl.backward is not None:
            assert decl.backward_op is not None
            backward = functools.partial(
                _call_backward,
                formula=decl.backward,
                backward_kernel=_LazyKernel(self, decl.backward_op, impl.name),
            )
            op.register_autograd(backward, setup_context=decl.setup_context)
        return op

    # ---------------------------------------------------------------- selection
    def select_kernel(
        self,
        op_name: str,
        requested: str,
        device_type: str,
        problem: Mapping[str, int] | None = None,
    ) -> KernelChoice:
        """Resolve ``auto | portable | <impl>`` for a device (and optionally a problem shape)."""
        impls = self._impls[self.declaration(op_name).name]
        if requested in SELECTION_POLICIES:
            return self._select_by_policy(op_name, requested, device_type, problem, impls)

        impl = self.impl(op_name, requested)
        if device_type not in impl.devices:
            raise KernelUnavailableError(
                f"kernel {requested!r} for {op_name!r} runs on {sorted(impl.devices)}, not on "
                f"{device_type!r}. Use backend.kernels=auto, or one of "
                f"{self._names_for_device(impls, device_type)} on {device_type!r}."
            )
        reason = impl.unavailable_reason()
        if reason is not None:
            raise KernelUnavailableError(f"kernel {requested!r} for {op_name!r} is unavailable: {reason}")
        reason = impl.unsupported_shape_reason(problem)
        if reason is not None:
            raise KernelUnavailableError(
                f"kernel {requested!r} for {op_name!r} does not support this model: {reason}. "
                "Use backend.kernels=portable or change the model shape."
            )
        return KernelChoice(op_name, impl.name, device_type, requested, self)

    def _select_by_policy(
        self,
        op_name: str,
        policy: str,
        device_type: str,
        problem: Mapping[str, int] | None,
        impls: Mapping[str, KernelImpl],
    ) -> KernelChoice:
        candidates = [impl for impl in impls.values() if device_type in impl.devices and (impl.portable or policy == AUTO)]
        skipped: list[str] = []
        usable: list[KernelImpl] = []
        for impl in candidates:
            reason = impl.unavailable_reason() or impl.unsupported_shape_reason(problem)
            if reason is None:
                usable.append(impl)
            else:
                skipped.append(f"{impl.name}: {reason}")
        if not usable:
            detail = "; ".join(skipped) or "no kernel is registered for this device"
            raise KernelUnavailableError(f"no {policy} kernel for {op_name!r} can run on {device_type!r} ({detail})")
        best = max(usable, key=lambda impl: impl.priority_on(device_type))
        message = (policy, op_name, device_type, best.name, "; ".join(skipped))
        if skipped and message not in self._logged:
            self._logged.add(message)
            logger.info("kernels=%s for %s on %s chose %r; skipped %s", *message)
        return KernelChoice(op_name, best.name, device_type, policy, self)

    @staticmethod
    def _names_for_device(impls: Mapping[str, KernelImpl], device_type: str) -> list[str]:
        return sorted(name for name, impl in impls.items() if device_type in impl.devices)


class _LazyKernel:
    """The backward op of the same implementation, resolved when backward first runs."""

    def __init__(self, registry: KernelRegistry, op_name: str, impl_name: str) -> None:
        self._registry, self._op_name, self._impl_name = registry, op_name, impl_name

    def __call__(self, *args: Any) -> Any:
        return self._registry.op_overload(self._op_name, self._impl_name)(*args)


def _call_backward(ctx: Any, *grads: Any, formula: Callable[..., Any], backward_kernel: _LazyKernel) -> Any:
    return formula(ctx, *grads, backward_kernel=backward_kernel)


def _memoize_probe(probe: Probe) -> Probe:
    """Probes may import heavy vendor modules: run each once per process."""
    cache: dict[str, str | None] = {}

    @functools.wraps(probe)
    def memoized() -> str | None:
        if "result" not in cache:
            cache["result"] = probe()
        return cache["result"]

    return memoized


# The project's registry. ``declare_op``/``register_kernel``/``select_kernel`` act on it.
KERNELS = KernelRegistry(namespace="qwen3_trn")
declare_op = KERNELS.declare_op
register_kernel = KERNELS.register_kernel
select_kernel = KERNELS.select_kernel


def resolve_op(
    op_name: str,
    requested: str,
    device_type: str,
    problem: Mapping[str, int] | None = None,
    *,
    registry: KernelRegistry = KERNELS,
) -> torch._ops.OpOverload:
    """``select_kernel(...).op``, callable inside ``torch.compile``'d code without graph breaks."""
    problem_items = tuple(sorted(problem.items())) if problem is not None else None
    name = _resolved_torch_op_name(registry, op_name, requested, device_type, problem_items)
    return getattr(getattr(torch.ops, registry.namespace), name).default


@torch.compiler.assume_constant_result
def _resolved_torch_op_name(
    registry: KernelRegistry,
    op_name: str,
    requested: str,
    device_type: str,
    problem_items: tuple[tuple[str, int], ...] | None,
) -> str:
    # Selection probes (imports) vendor modules, so torch.compile runs it eagerly and keeps only
    # its result: the operator's name, a constant string (operator objects cannot be guarded).
    problem = dict(problem_items) if problem_items is not None else None
    choice = registry.select_kernel(op_name, requested, device_type, problem)
    choice.op  # noqa: B018 - create the operator now, outside the traced region
    return choice.torch_op_name
