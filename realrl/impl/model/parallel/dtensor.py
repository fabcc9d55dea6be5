"""DTensor checks that cost nothing where no model is sharded.

``torch.distributed.tensor`` takes about a second to import; a process that never imported it
holds no DTensor, so these look it up in ``sys.modules`` instead of importing it.
"""

from __future__ import annotations

import sys

import torch


def is_dtensor(t: object) -> bool:
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(t, module.DTensor)


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of ``t`` (``t`` itself when it is not a DTensor)."""
    return t.to_local() if is_dtensor(t) else t


def summand(t: torch.Tensor) -> torch.Tensor:
    """This rank's summand of ``t`` (a DTensor partial over its mesh; any other tensor is its own
    summand) as a plain tensor. The gradient of a sum reaches each summand unchanged, so the
    plain tensor's gradient goes back as a replicated one, not as another partial sum."""
    if not is_dtensor(t):
        return t
    from torch.distributed.tensor import Replicate

    return t.to_local(grad_placements=[Replicate()] * t.device_mesh.ndim)
