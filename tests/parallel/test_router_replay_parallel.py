"""Router replay on a Mixture-of-Experts model split over two gloo ranks (m2), tensor parallel
(every expert split) and expert parallel (whole experts, two per rank), against the whole model:
every rank routes every token with the whole router, so decoding records the whole model's
experts, and a packed forward given them gives the whole model's replayed logits and router
gradient (tiny mixtral)."""

from __future__ import annotations

import dataclasses
import os

import torch
from _ranks import TIMEOUT, run_ranks
from model_fixtures import make_hf_model, packed
from test_fsdp_tp_families import whole

from realrl.api.core.layout import Layout, Placement
from realrl.api.core.model_api import GenerationHyperparameters
from realrl.impl.model.nn.hf_io import load_pretrained
from realrl.impl.model.nn.real_model import ReaLModel
from realrl.impl.model.parallel.apply import parallelize
from realrl.impl.model.parallel.mesh import build_contexts

PLACEMENT = {"m2": Placement(Layout(tp=2), (0, 1))}
EOS = 1


def run(model: ReaLModel) -> dict:
    """Greedy answers with their experts, then the replayed forward's logits and router gradients."""
    prompts, pcu = packed([5, 9, 3], seed=2)
    g = GenerationHyperparameters(max_new_tokens=6, greedy=True, record_experts=True)
    with torch.no_grad():
        out = model.generate(prompts, pcu, g, EOS)
    cu = torch.tensor([0, *out.seqlens]).cumsum(0).int()
    logits = model(out.sequences, cu, routed_experts=out.routed_experts)
    logits.float().logsumexp(-1).sum().backward()
    routers = {n: whole(p.grad) for n, p in model.named_parameters() if n.endswith("router.weight")}
    return {
        "tokens": out.sequences,
        "routed": out.routed_experts,
        "logits": whole(logits.detach()),
        "routers": routers,
    }


def worker(rank: int, path: str) -> dict:
    ctx = build_contexts(PLACEMENT, rank, "cpu", TIMEOUT)["m2"]
    ref = run(ReaLModel.from_pretrained(path))
    tp = ReaLModel.from_pretrained(path, tp_mesh=ctx.tp_mesh)
    parallelize(tp, ctx)
    ep = load_pretrained(ReaLModel, path, False, None, "auto", None, "reward", ctx.tp_mesh, True)
    parallelize(ep, dataclasses.replace(ctx, expert_parallel=True))
    return {"ref": ref, "tp": run(tp), "ep": run(ep)}


def test_split_models_record_and_replay_the_whole_models_experts(tmp_path):
    path = os.path.join(tmp_path, "mixtral")
    make_hf_model("mixtral").save_pretrained(path)
    for rank in run_ranks(worker, tmp_path, path):
        ref = rank["ref"]
        for how in ("tp", "ep"):
            got = rank[how]
            assert torch.equal(got["tokens"], ref["tokens"]) and torch.equal(got["routed"], ref["routed"]), (
                how
            )
            assert (got["logits"] - ref["logits"]).abs().max() < 1e-5, how
            assert sorted(got["routers"]) == sorted(ref["routers"]), how
            for name, grad in got["routers"].items():
                assert float(grad.abs().sum()) > 0, (how, name)
                torch.testing.assert_close(grad, ref["routers"][name], atol=1e-5, rtol=1e-4)
