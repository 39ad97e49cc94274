"""The layouts a vendor's stack runs on an instance type, and the degrees it cannot run.

``parallelism=auto`` picks only among a rule's layouts; an expert-parallel degree the stack
cannot run is refused. Instance types without a rule take every layout torchtitan accepts.
"""

from __future__ import annotations

from dataclasses import dataclass

from qwen3_trn.common.errors import ConfigError
from qwen3_trn.config.schema import RunConfig
from qwen3_trn.devices import DeviceSpec
from qwen3_trn.run.fit.device_memory import DEFAULT_ACCELERATOR, accelerator
from qwen3_trn.run.layout import Layout

# torch-neuronx's ProcessGroupNeuron.alltoall_base (torch_neuronx/distributed/backend.py) takes only
# even splits (None or all ones) and raises NotImplementedError otherwise; torchtitan's all-to-all
# token dispatcher sends each rank's routed-token counts as uneven split sizes. AWS ships expert
# parallel (torchtitan-neuron's neuron_ep) for Trn3 only.
NEURON_ALL_TO_ALL = (
    "torch-neuronx's ProcessGroupNeuron.alltoall_base (torch_neuronx/distributed/backend.py) raises "
    "NotImplementedError for uneven split sizes, which torchtitan's all-to-all token dispatcher sends for "
    "every MoE layer (AWS ships expert parallel, torchtitan-neuron's neuron_ep, on Trn3 only)"
)


@dataclass(frozen=True)
class VendorLayouts:
    """What the vendor's recipes run on one instance type."""

    instance: str
    # Tensor-parallel degrees inside a node that the recipes use, the rest of the ranks FSDP (and
    # replicas across nodes), without pipeline or context parallel; None: no recipe layout, every
    # layout torchtitan accepts but the degrees refused below.
    tensor_parallel: tuple[int, ...] | None
    # Why expert parallel cannot run there (None: it can).
    no_expert_parallel: str | None
    # The recipes these layouts come from.
    source: str

    def admits(self, layout: Layout) -> bool:
        if layout.ep > 1 and self.no_expert_parallel is not None:
            return False
        return self.tensor_parallel is None or (layout.tp in self.tensor_parallel and layout.pp == 1 and layout.cp == 1)

    def describe(self) -> str:
        if self.tensor_parallel is None:
            return f"any layout without expert parallel; {self.source}"
        tp = " or ".join(f"TP{tp}" for tp in self.tensor_parallel)
        return f"{tp} inside a node x FSDP over the rest, no expert or pipeline parallel; {self.source}"


_TRN2_RECIPES = "AWS's TorchTitan Neuron recipes for Qwen3-8B and Qwen3-30B-A3B (qwen3_8b_tp4_fsdp16_sac: TP4 x FSDP16, selective AC)"
# Keyed by the accelerator table's names (qwen3_trn.run.fit.device_memory.ACCELERATORS).
VENDOR_LAYOUTS: dict[str, VendorLayouts] = {
    "trn2": VendorLayouts("trn2.48xlarge (LNC=2)", (4,), NEURON_ALL_TO_ALL, _TRN2_RECIPES),
    "trn2-lnc1": VendorLayouts("trn2.48xlarge (LNC=1)", (4,), NEURON_ALL_TO_ALL, _TRN2_RECIPES),
    "trn1": VendorLayouts("trn1.32xlarge", None, NEURON_ALL_TO_ALL, "TorchTitan Neuron's recipes are for Trn2 and Trn3"),
}


def vendor_layouts(cfg: RunConfig, device: DeviceSpec) -> VendorLayouts | None:
    """The rule of the instance type the run targets, or None where the device has none."""
    if device.type not in DEFAULT_ACCELERATOR:
        return None
    return VENDOR_LAYOUTS.get(accelerator(device.type, cfg.device.accelerator, cfg.launcher.env).name)


def check_vendor_layout(cfg: RunConfig, device: DeviceSpec, layout: Layout) -> None:
    """Refuse an expert-parallel degree the instance type's stack cannot run."""
    rules = vendor_layouts(cfg, device)
    if rules is None or layout.ep == 1 or rules.no_expert_parallel is None:
        return
    raise ConfigError(
        "parallelism.ep",
        f"expert parallel (ep={layout.ep}) cannot run on {rules.instance} with {device.type}: {rules.no_expert_parallel}. "
        f"Set parallelism.ep=1, so that FSDP and tensor parallel shard the experts as AWS's layouts do "
        f"({rules.describe()}), or use parallelism=auto.",
    )
