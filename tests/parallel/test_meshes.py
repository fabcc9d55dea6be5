"""A model's device mesh on its workers: which worker is which (dp, tp) coordinate, and process
groups whose collectives give up after the run's timeout when a partner never comes."""

from __future__ import annotations

import datetime
import time

import torch
import torch.distributed as dist
from _ranks import run_ranks

from realrl.api.core.layout import Layout, Placement
from realrl.impl.model.parallel.mesh import build_contexts

PLACEMENTS = {
    "actor": Placement(Layout(1, 2, 1), (1, 0)),  # tp rank 0 on worker 1
    "critic": Placement(Layout(2, 1, 1), (0, 1)),
    "ref": Placement(Layout(1, 1, 1), (1,)),
}


def mesh_worker(rank: int) -> dict:
    contexts = build_contexts(PLACEMENTS, rank, "cpu", datetime.timedelta(seconds=3))
    out = {
        role: (tuple(c.mesh.get_coordinate()) if c.mesh else None, c.model_rank)
        for role, c in contexts.items()
    }
    if rank == 0:  # worker 1 never joins this all-reduce
        tik = time.monotonic()
        try:
            dist.all_reduce(torch.ones(1), group=contexts["actor"].tp_group)
            out["failed_after"] = None
        except RuntimeError:
            out["failed_after"] = time.monotonic() - tik
    else:
        time.sleep(6)
    return out


def test_every_worker_knows_its_coordinates_and_collectives_time_out(tmp_path):
    w0, w1 = run_ranks(mesh_worker, tmp_path)
    # (dp, tp) coordinates follow the placement; ranks in the whole-model group follow worker order
    assert w0["actor"] == ((0, 1), 0) and w1["actor"] == ((0, 0), 1)
    assert w0["critic"] == ((0, 0), 0) and w1["critic"] == ((1, 0), 1)
    assert "ref" not in w0 and w1["ref"] == (None, 0)  # one rank: no mesh
    assert w0["failed_after"] is not None and 2.0 < w0["failed_after"] < 5.5
