"""backend=nki_moe: Qwen3 MoE whose expert MLPs run the project's kernels (``qwen3_trn.kernels``),
swapped in by torchtitan's model-config converter; ``backend.kernels`` picks one.
"""

from __future__ import annotations

from typing import Any

from qwen3_trn.backends.base import Backend, ShardingDegrees
from qwen3_trn.common.errors import ConfigError, NotApplicable
from qwen3_trn.common.local_tensors import local_tensor
from qwen3_trn.config.option_schemas import NkiMoeBackendConfig
from qwen3_trn.config.schema import RunConfig
from qwen3_trn.devices import DeviceSpec
from qwen3_trn.kernels import (
    KernelExpertsConverter,
    KernelGroupedExperts,
    KernelUnavailableError,
    TokenGroupAlignmentError,
    check_token_group_alignment,
    logical_neuron_cores,
    moe_problem,
    resolved_kernel_name,
)
from qwen3_trn.kernels.moe import GROUPED_MM_TOKEN_ALIGNMENT
from qwen3_trn.models.architecture import Qwen3Architecture
from qwen3_trn.models.attention import inner_attention_config, resolve_attention
from qwen3_trn.models.qwen3 import native_model_spec
from qwen3_trn.models.torchtitan_neuron import recipe_model_spec, unavailable_reason
from qwen3_trn.titan import ModelSpec, expert_weights

# backend.kernels: the model of torchtitan-neuron's own NKI MoE recipe (qwen3_trn.models.torchtitan_neuron),
# chosen by name only: AWS's Neuron 2.34 recipes left it for torch._grouped_mm, which kernels=auto picks.
TORCHTITAN_NEURON = "torchtitan_neuron"


class NkiMoeBackend(Backend):
    Config = NkiMoeBackendConfig

    description = "Qwen3 MoE with kernel-backed experts (NKI on Trainium, portable kernels elsewhere)"
    config: Config

    def uses_recipe(self) -> bool:
        """Whether the model comes from torchtitan-neuron's recipe rather than the project's kernels."""
        return self.config.kernels == TORCHTITAN_NEURON

    def kernel_name(self, device: DeviceSpec, problem: dict[str, int] | None = None, where: str = "") -> str:
        """The kernel ``backend.kernels`` resolves to on ``device`` for one rank's shapes; ``where``
        names whose shapes in an error."""
        if self.uses_recipe():
            return TORCHTITAN_NEURON
        try:
            return resolved_kernel_name(self.config.kernels, device.type, **(problem or {}))
        except KernelUnavailableError as exc:
            raise ConfigError("backend.kernels", f"{where}{exc}") from exc
        except ValueError as exc:
            raise ConfigError(
                "backend.kernels", f"{exc} Use kernels=auto, kernels=portable or a kernel name listed in qwen3_trn/kernels/README.md."
            ) from exc

    def local_problem(self, cfg: RunConfig, arch: Qwen3Architecture, degrees: ShardingDegrees) -> dict[str, int]:
        """What one rank's expert kernel sees. torchtitan shards the experts over ``ep``, else their
        hidden dim over ``tp``. A call's rows are the rank's tokens times top_k; under expert parallel,
        at most ``ep`` times the rows one rank routes here (``min(top_k, local experts)`` per token)."""
        ep, tp = max(degrees.ep, 1), max(degrees.tp, 1)
        experts = arch.num_experts // ep
        tokens = cfg.training.local_batch_size * (cfg.training.seq_len // max(degrees.cp, 1))
        rows = tokens * arch.top_k if ep == 1 else ep * tokens * min(arch.top_k, experts)
        return moe_problem(
            dim=arch.dim,
            hidden_dim=arch.moe_hidden_dim if ep > 1 else arch.moe_hidden_dim // tp,
            num_experts=experts,
            tokens=rows,
            logical_cores=logical_neuron_cores(cfg.launcher.env),
        )

    def model_spec(self, cfg: RunConfig, arch: Qwen3Architecture, device: DeviceSpec) -> ModelSpec:
        if self.uses_recipe():
            return recipe_model_spec(cfg, arch)
        attention = resolve_attention(cfg.model.attention, device.default_attention)
        converter = KernelExpertsConverter.Config(kernel=self.config.kernels)
        return native_model_spec(cfg.model.flavor, arch, inner_attention_config(attention), converters=[converter])

    def validate(self, cfg: RunConfig, arch: Qwen3Architecture, device: DeviceSpec) -> None:
        if not arch.is_moe:
            raise NotApplicable(
                "backend.name",
                f"backend=nki_moe trains mixture-of-experts models, but model={cfg.model.flavor} is dense; "
                "choose an MoE model (tiny_moe, debugmodel_moe, 30B-A3B, 235B-A22B) or backend=native.",
            )
        if self.uses_recipe():
            reason = unavailable_reason() or (
                None if device.type == "neuron" else f"its model runs NKI kernels, on neuron, not {device.type}"
            )
            if reason is not None:
                raise ConfigError(
                    "backend.kernels",
                    f"kernels={TORCHTITAN_NEURON} cannot run: {reason}. Use backend.kernels=auto, nki or portable.",
                )
        self.kernel_name(device)
        if device.type == "neuron":
            try:
                check_token_group_alignment(
                    tokens_per_step=cfg.training.local_batch_size * cfg.training.seq_len,
                    top_k=arch.top_k,
                    num_experts=arch.num_experts,
                    alignment=GROUPED_MM_TOKEN_ALIGNMENT[device.type],
                    pads_token_groups=True,
                )
            except TokenGroupAlignmentError as exc:
                raise ConfigError("training.seq_len", str(exc)) from exc

    def validate_sharded(self, cfg: RunConfig, arch: Qwen3Architecture, device: DeviceSpec, degrees: ShardingDegrees) -> None:
        if not arch.is_moe:
            return
        problem = self.local_problem(cfg, arch, degrees)
        where = (
            f"with tp={degrees.tp}, cp={degrees.cp}, ep={degrees.ep}, one rank's experts are "
            f"{problem['num_experts']} x (dim {problem['dim']}, hidden_dim {problem['hidden_dim']}), "
            f"up to {problem['tokens']} rows per call, at {problem['logical_cores']} logical core(s) per rank; "
        )
        self.kernel_name(device, problem, where)

    def run_info(self, cfg: RunConfig, arch: Qwen3Architecture, device: DeviceSpec) -> dict[str, Any]:
        # A prediction from the config's degrees (what_ran records the built model's); a shape
        # the kernel refuses is reported by validate_sharded once the layout is final.
        try:
            kernel = self.kernel_name(device, self.local_problem(cfg, arch, cfg.parallelism))
        except ConfigError:
            kernel = self.kernel_name(device)
        return {"kernel": kernel, "kernels_requested": self.config.kernels}

    def what_ran(self, parts: list[Any], device_type: str) -> dict[str, Any]:
        """The kernel each expert module's forward selects for its local (EP/TP-sharded) weights."""
        kernels = set()
        for part in parts:
            for module in part.modules():
                if isinstance(module, KernelGroupedExperts):
                    weight = local_tensor(expert_weights(module)[0])
                    experts, hidden_dim, dim = weight.shape
                    kernels.add(resolved_kernel_name(module.kernel, device_type, dim=dim, hidden_dim=hidden_dim, num_experts=experts))
        return {"kernel": ",".join(sorted(kernels))} if kernels else {}
