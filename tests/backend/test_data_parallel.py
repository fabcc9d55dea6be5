"""Data parallelism: 2 CPU processes (gloo) give the single-process gradient and update."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from _backend_toy import PackedToyLM, make_batch, n_loss_tokens, token_loss

from realrl.api.core.data_api import MicroBatchSpec
from realrl.api.core.layout import Layout, Placement
from realrl.base.network import find_free_port
from realrl.impl.model.backend.config import OptimizerConfig
from realrl.impl.model.backend.train_engine import TrainEngine
from realrl.impl.model.parallel.mesh import build_contexts

LENGTHS = [5, 9, 3, 12, 7, 4, 10, 6, 8, 11]
SPLIT = [3, 7]  # uneven token counts per rank: a per-rank mean would be wrong for "global"
OPT = OptimizerConfig(lr=1e-2, weight_decay=0.1, grad_clip=0.5)


def make_engine(parallel=None) -> TrainEngine:
    torch.manual_seed(0)
    return TrainEngine(PackedToyLM(), OPT, total_train_steps=4, parallel=parallel)


def grads(engine: TrainEngine) -> list[torch.Tensor]:
    return [p.grad.clone() for p in engine.module.parameters()]


def worker(rank: int, port: int, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        parallel = build_contexts({"toy": Placement(Layout(dp=2), (0, 1))}, rank, "cpu")["toy"]
        part = make_batch(LENGTHS).split_with_lengths(SPLIT)[rank]
        engine = make_engine(parallel)
        result = {}
        for scope in ("global", "dp"):
            engine.optimizer.zero_grad(set_to_none=True)
            engine.accumulate_gradients(part, MicroBatchSpec(n_mbs=2), token_loss, n_loss_tokens, scope)
            result[scope] = grads(engine)
        engine.optimizer.zero_grad(set_to_none=True)
        for i in range(2):
            engine.train_batch(part, MicroBatchSpec(n_mbs=2), token_loss, n_loss_tokens, version_steps=i)
        result["params"] = [p.detach().clone() for p in engine.module.parameters()]
        ckpt = os.path.join(out_dir, "ckpt")
        engine.save(ckpt, extra_state={"rank": rank, "position": 10 + rank})
        fresh = make_engine(parallel)
        result["extra"] = fresh.load(ckpt)
        result["loaded_equal"] = all(
            torch.equal(a, b) for a, b in zip(engine.module.parameters(), fresh.module.parameters())
        )
        torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_two_ranks_match_one_process(tmp_path):
    mp.spawn(worker, args=(find_free_port(), str(tmp_path)), nprocs=2, join=True)
    results = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    batch = make_batch(LENGTHS)

    single = make_engine()
    single.accumulate_gradients(batch, None, token_loss, n_loss_tokens)
    want_global = grads(single)

    halves = []  # "dp" scope: the average of each rank's own token mean
    for part in batch.split_with_lengths(SPLIT):
        e = make_engine()
        e.accumulate_gradients(part, None, token_loss, n_loss_tokens)
        halves.append(grads(e))
    want_dp = [(a + b) / 2 for a, b in zip(*halves)]
    assert max(float((a - b).abs().max()) for a, b in zip(want_global, want_dp)) > 1e-4

    for res in results:
        for got, want in zip(res["global"], want_global):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        for got, want in zip(res["dp"], want_dp):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)

    single.optimizer.zero_grad(set_to_none=True)
    for i in range(2):
        single.train_batch(batch, MicroBatchSpec(n_mbs=3), token_loss, n_loss_tokens, version_steps=i)
    for res in results:
        for got, want in zip(res["params"], single.module.parameters()):
            torch.testing.assert_close(got, want.detach(), rtol=1e-5, atol=1e-6)
    assert [r["extra"] for r in results] == [{"rank": 0, "position": 10}, {"rank": 1, "position": 11}]
    assert all(r["loaded_equal"] for r in results)
    assert sorted(os.listdir(tmp_path / "ckpt")) == [
        "engine_state.pt",
        "extra_state_rank0.pt",
        "extra_state_rank1.pt",
        "model.safetensors",
        "rng_state_rank0.pt",
        "rng_state_rank1.pt",
    ]
