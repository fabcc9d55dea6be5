"""A model's device mesh on this worker, and the process groups the engines use.

Every worker builds the mesh of every model in the same order (creating a process group is a
collective over all workers), and keeps the ones it belongs to. The mesh is 2-D, ``("dp",
"tp")``; the ranks of a layout map to workers as ``Placement`` says (tp fastest).
"""

from __future__ import annotations

import dataclasses
import datetime

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from realrl.api.core.layout import Layout, Placement


def comm_device(group: dist.ProcessGroup | None) -> torch.device:
    """Where a tensor must be for a collective over ``group``: NCCL (alone or beside gloo, as a
    worker with its own GPU sets up) reduces CUDA tensors; gloo-only groups take CPU tensors."""
    if group is not None and "nccl" in str(dist.get_backend(group)):
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


@dataclasses.dataclass
class ParallelContext:
    """What one rank of a parallel model needs to know about its layout.

    ``mesh`` is None for a model on one worker; ``dp_group`` / ``tp_group`` are None when that
    size is 1; ``model_group`` holds every rank of the model (checkpoints are collective over it).
    ``fsdp``: parameters, gradients and optimizer state are sharded over the dp ranks.
    ``expert_parallel``: a Mixture-of-Experts model's sparse blocks keep whole experts on each tp
    rank (an equal share) instead of splitting every expert (``parallel/tensor_parallel.py``).
    """

    layout: Layout
    mesh: DeviceMesh | None
    model_group: dist.ProcessGroup | None
    fsdp: bool = False
    expert_parallel: bool = False

    @property
    def dp_group(self) -> dist.ProcessGroup | None:
        return None if self.mesh is None or self.layout.dp == 1 else self.mesh.get_group("dp")

    @property
    def tp_group(self) -> dist.ProcessGroup | None:
        return None if self.mesh is None or self.layout.tp == 1 else self.mesh.get_group("tp")

    @property
    def dp_mesh(self) -> DeviceMesh:
        return self.mesh["dp"]

    @property
    def tp_mesh(self) -> DeviceMesh:
        return self.mesh["tp"]

    @property
    def sharded(self) -> bool:
        """Whether parameters are DTensors (tensor parallel or FSDP): checkpoints gather them."""
        return self.layout.tp > 1 or (self.fsdp and self.layout.dp > 1)

    @property
    def model_rank(self) -> int:
        """This worker's rank among all ranks of the model (in worker order)."""
        return 0 if self.model_group is None else dist.get_rank(self.model_group)

    @property
    def is_writer(self) -> bool:
        """The one rank that writes the files of a checkpoint."""
        return self.model_rank == 0


def build_contexts(
    placements: dict[str, Placement],
    me: int,
    device_type: str,
    timeout: datetime.timedelta | None = None,
) -> dict[str, ParallelContext]:
    """The ``ParallelContext`` of every model this worker (``me``) holds a rank of.

    Collective over every worker: each calls it with the same ``placements`` (creating a process
    group is), so all create the same groups in the same order. Every group gets ``timeout``
    (default: torch's), so a collective whose partner is gone fails instead of waiting on.
    """
    out = {}
    for role, placement in sorted(placements.items()):
        lay = placement.layout
        if lay.pp != 1:
            raise ValueError(
                f"model {role!r}: layout {lay} asks for pipeline parallelism, which realrl does not do"
            )
        if lay.world_size == 1:
            if me in placement.workers:
                out[role] = ParallelContext(lay, None, None)
            continue
        grid = torch.tensor(placement.workers, dtype=torch.long).view(lay.dp, lay.tp)
        group = dist.new_group(sorted(placement.workers), timeout=timeout)
        dp_groups = [dist.new_group(grid[:, t].tolist(), timeout=timeout) for t in range(lay.tp)]
        tp_groups = [dist.new_group(grid[d, :].tolist(), timeout=timeout) for d in range(lay.dp)]
        if me in placement.workers:
            _, d, t = placement.coords_of(me)
            mesh = DeviceMesh.from_group(
                [dp_groups[t], tp_groups[d]], device_type, mesh=grid, mesh_dim_names=("dp", "tp")
            )
            out[role] = ParallelContext(lay, mesh, group)
    return out
