"""The rank-local part of a parameter or buffer, whether or not it is a ``DTensor``.

FSDP, TP and EP turn parameters and buffers into ``DTensor``s; code that reads or writes a
rank's own values (kernels, in-place initialisation, counting) works on the local shard.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor

__all__ = ["local_tensor"]


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of ``tensor`` when it is a ``DTensor`` (a view sharing its storage), else ``tensor``."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor
