"""A model's device mesh on this worker, and the process groups the engines use.

Every worker builds the mesh of every model in the same order (creating a process group is a
collective over all workers), and keeps the ones it belongs to. The mesh is ``("dp", "tp")``, or
``("pp", "dp", "tp")`` for a pipelined layout; the ranks of a layout map to workers as
``Placement`` says (tp fastest, pp slowest). Each pipeline stage is then an ordinary (dp, tp) mesh
of its own: tensor parallelism and FSDP work within a stage as they do on a whole model.
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools

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

    ``mesh`` is None for a model on one worker; ``dp_group`` / ``tp_group`` / ``pp_group`` are None
    when that size is 1; ``model_group`` holds every rank of the model (checkpoints are collective
    over it). ``ends_group``: a pipelined model's first and last stage at this rank's (dp, tp)
    coordinates, which both hold a tied embedding (None without pipeline stages).
    ``fsdp``: parameters, gradients and optimizer state are sharded over the dp ranks.
    ``expert_parallel``: a Mixture-of-Experts model's sparse blocks keep whole experts on each tp
    rank (an equal share) instead of splitting every expert (``parallel/tensor_parallel.py``).
    """

    layout: Layout
    mesh: DeviceMesh | None
    model_group: dist.ProcessGroup | None
    fsdp: bool = False
    expert_parallel: bool = False
    ends_group: dist.ProcessGroup | None = None
    stages_group: dist.ProcessGroup | None = None  # every rank of this rank's replica (pp x tp)

    @property
    def replica_group(self) -> dist.ProcessGroup | None:
        """Every rank of this rank's data-parallel replica (its tensor-parallel ranks of every
        stage), which all run each call on the same batch; None for a replica of one rank."""
        return self.stages_group if self.layout.pp > 1 else self.tp_group

    @property
    def dp_group(self) -> dist.ProcessGroup | None:
        return None if self.mesh is None or self.layout.dp == 1 else self.mesh.get_group("dp")

    @property
    def tp_group(self) -> dist.ProcessGroup | None:
        return None if self.mesh is None or self.layout.tp == 1 else self.mesh.get_group("tp")

    @property
    def pp_group(self) -> dist.ProcessGroup | None:
        return None if self.mesh is None or self.layout.pp == 1 else self.mesh.get_group("pp")

    @property
    def coords(self) -> tuple[int, int, int]:
        """This rank's (pp, dp, tp) coordinates in its layout. Read from the mesh's grid, not from
        the groups: torch orders a group's ranks by worker, a layout may place them otherwise."""
        if self.mesh is None:
            return 0, 0, 0
        coordinate = tuple(self.mesh.get_coordinate())
        return coordinate if len(coordinate) == 3 else (0, *coordinate)

    @property
    def stage(self) -> int:
        """This rank's pipeline stage (0 without pipeline parallelism)."""
        return self.coords[0]

    @property
    def stage_ranks(self) -> tuple[int, ...]:
        """The global rank of every stage of this rank's pipeline, in stage order."""
        if self.pp_group is None:
            return (dist.get_rank(),)
        _, d, t = self.coords
        return tuple(int(r) for r in self.mesh.mesh[:, d, t])

    @property
    def dp_mesh(self) -> DeviceMesh:
        return self.mesh["dp"]

    @property
    def tp_mesh(self) -> DeviceMesh:
        return self.mesh["tp"]

    @property
    def sharded(self) -> bool:
        """Whether no single rank holds the whole model (tensor parallel, FSDP or pipeline stages):
        checkpoints gather it or save each rank's part."""
        return self.layout.tp > 1 or self.layout.pp > 1 or (self.fsdp and self.layout.dp > 1)

    @property
    def model_rank(self) -> int:
        """This worker's rank among all ranks of the model (in worker order)."""
        return 0 if self.model_group is None else dist.get_rank(self.model_group)

    @property
    def is_writer(self) -> bool:
        """The one rank that writes the files of a checkpoint."""
        return self.model_rank == 0


def _lines(
    grid: torch.Tensor, dim: int, timeout: datetime.timedelta | None
) -> dict[tuple[int, ...], dist.ProcessGroup]:
    """One group per line of the (pp, dp, tp) worker grid along ``dim``, keyed by the other two
    coordinates (collective over every worker)."""
    moved = grid.movedim(dim, -1)
    return {
        key: dist.new_group(moved[key].tolist(), timeout=timeout)
        for key in itertools.product(*(range(n) for n in moved.shape[:-1]))
    }


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
        if lay.world_size == 1:
            if me in placement.workers:
                out[role] = ParallelContext(lay, None, None)
            continue
        grid = torch.tensor(placement.workers, dtype=torch.long).view(lay.pp, lay.dp, lay.tp)
        group = dist.new_group(sorted(placement.workers), timeout=timeout)
        pp_lines = _lines(grid, 0, timeout) if lay.pp > 1 else {}
        dp_lines, tp_lines = _lines(grid, 1, timeout), _lines(grid, 2, timeout)
        ends, replicas = {}, {}
        if lay.pp > 1:  # the first and last stage of each (dp, tp) line: a tied embedding's holders
            ends = {
                (d, t): dist.new_group([int(grid[0, d, t]), int(grid[-1, d, t])], timeout=timeout)
                for d in range(lay.dp)
                for t in range(lay.tp)
            }
            replicas = {
                d: dist.new_group(grid[:, d, :].flatten().tolist(), timeout=timeout) for d in range(lay.dp)
            }
        if me not in placement.workers:
            continue
        p, d, t = placement.coords_of(me)
        if lay.pp > 1:
            groups, names, mesh_grid = (
                [pp_lines[d, t], dp_lines[p, t], tp_lines[p, d]],
                ("pp", "dp", "tp"),
                grid,
            )
        else:
            groups, names, mesh_grid = [dp_lines[p, t], tp_lines[p, d]], ("dp", "tp"), grid[0]
        mesh = DeviceMesh.from_group(groups, device_type, mesh=mesh_grid, mesh_dim_names=names)
        out[role] = ParallelContext(
            lay, mesh, group, ends_group=ends.get((d, t)), stages_group=replicas.get(d)
        )
    return out
