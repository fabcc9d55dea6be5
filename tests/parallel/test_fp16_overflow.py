"""fp16 loss scaling under tensor parallelism: an overflow in one rank's shard skips the update
on every rank, and every rank backs off the scale alike (otherwise the ranks' weights part)."""

from __future__ import annotations

import dataclasses

import torch
from _ranks import TIMEOUT, run_ranks
from model_fixtures import tiny_config

from realrl.api.core.layout import Layout, Placement
from realrl.impl.model.backend.config import EngineConfig, OptimizerConfig
from realrl.impl.model.backend.train_engine import TrainEngine
from realrl.impl.model.nn.real_model import ReaLModel
from realrl.impl.model.parallel.apply import parallelize
from realrl.impl.model.parallel.dtensor import local
from realrl.impl.model.parallel.mesh import build_contexts


def worker(rank: int) -> dict:
    parallel = build_contexts({"m": Placement(Layout(tp=2), (0, 1))}, rank, "cpu", TIMEOUT)["m"]
    torch.manual_seed(0)
    module = ReaLModel(tiny_config(hf_model_type="llama"))
    parallelize(module, dataclasses.replace(parallel, fsdp=False))
    engine = TrainEngine(
        module, OptimizerConfig(lr=1e-2), EngineConfig(dtype="fp16"), total_train_steps=2, parallel=parallel
    )
    params = list(module.parameters())
    for p in params:
        p.grad = torch.zeros_like(p)
    split = next(p for p in params if local(p).shape != p.shape)  # a tensor-parallel shard
    if rank == 0:
        local(split.grad).view(-1)[0] = float("inf")  # only rank 0's shard overflows
    before = [local(p).detach().clone() for p in params]
    scale = engine.loss_scaler.get_scale()
    stats = engine.optimizer_step(version_steps=0)
    return {
        "skipped": stats["update_skipped"],
        "unchanged": all(torch.equal(b, local(p)) for b, p in zip(before, params)),
        "scale": (scale, engine.loss_scaler.get_scale()),
    }


def test_an_overflow_in_one_shard_skips_the_update_on_every_rank(tmp_path):
    results = run_ranks(worker, tmp_path)
    for r in results:
        assert r["skipped"] == 1.0 and r["unchanged"], r
        assert r["scale"][1] == r["scale"][0] / 2
