"""World size and parallel degrees: which process does what."""

from __future__ import annotations

import math
from dataclasses import dataclass

from qwen3_trn.common.errors import ConfigError
from qwen3_trn.config.schema import ParallelismConfig

DEGREES = ("dp_replicate", "dp_shard", "cp", "tp", "pp")


@dataclass(frozen=True)
class Layout:
    nnodes: int
    nproc_per_node: int
    dp_replicate: int
    dp_shard: int
    cp: int
    tp: int
    pp: int
    ep: int

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node

    @property
    def data_parallel(self) -> int:
        return self.dp_replicate * self.dp_shard

    def degrees(self) -> str:
        """The degrees above 1 (``dp_shard=64, ep=64``), or ``single`` for one rank."""
        return ", ".join(f"{name}={getattr(self, name)}" for name in (*DEGREES, "ep") if getattr(self, name) > 1) or "single"

    def describe(self) -> str:
        parts = [f"{name}={getattr(self, name)}" for name in (*DEGREES, "ep")]
        return f"world {self.world_size} = {self.nnodes} node(s) x {self.nproc_per_node} rank(s): " + ", ".join(parts)


def resolve_layout(parallelism: ParallelismConfig, nnodes: int, nproc_per_node: int) -> Layout:
    """Fill the one degree given as -1 and check that the degrees multiply to the world size."""
    if nnodes < 1:
        raise ConfigError("launcher.nnodes", f"must be >= 1, got {nnodes}.")
    if nproc_per_node < 1:
        raise ConfigError("launcher.nproc_per_node", f"must be >= 1 (or -1 for one rank per device), got {nproc_per_node}.")
    world = nnodes * nproc_per_node
    degrees = {name: getattr(parallelism, name) for name in DEGREES}
    for name, value in (*degrees.items(), ("ep", parallelism.ep)):
        if value == 0 or value < -1 or (name == "ep" and value < 1):
            raise ConfigError(
                f"parallelism.{name}", f"must be a positive degree{' or -1 (the rest)' if name != 'ep' else ''}, got {value}."
            )
    open_degrees = [name for name, value in degrees.items() if value == -1]
    if len(open_degrees) > 1:
        raise ConfigError(
            f"parallelism.{open_degrees[1]}",
            f'only one degree may be -1 ("the rest"), but {", ".join(open_degrees)} all are; give all but one a number.',
        )
    fixed = math.prod(value for value in degrees.values() if value != -1)
    shown = " x ".join(f"{name}={value}" for name, value in degrees.items())
    if open_degrees:
        if world % fixed:
            raise ConfigError(
                f"parallelism.{open_degrees[0]}",
                f"the fixed degrees multiply to {fixed} ({shown}), which does not divide the world size "
                f"{world} = launcher.nnodes {nnodes} x launcher.nproc_per_node {nproc_per_node}; "
                "change a degree or the number of ranks.",
            )
        degrees[open_degrees[0]] = world // fixed
    elif fixed != world:
        raise ConfigError(
            "parallelism",
            f"{shown} = {fixed}, but the world size is {world} = launcher.nnodes {nnodes} x "
            f"launcher.nproc_per_node {nproc_per_node}; set one degree to -1 or make them multiply to {world}.",
        )
    ep = parallelism.ep
    if ep > 1 and (degrees["dp_shard"] * degrees["cp"]) % ep:
        raise ConfigError(
            "parallelism.ep",
            f"expert parallel degree {ep} must divide dp_shard x cp = {degrees['dp_shard'] * degrees['cp']} "
            "(torchtitan borrows expert-parallel ranks from them).",
        )
    return Layout(nnodes=nnodes, nproc_per_node=nproc_per_node, ep=ep, **degrees)
