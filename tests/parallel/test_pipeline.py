"""Pipeline stages over gloo ranks against the whole model on one process: packed micro-batches
of different lengths, logits of inference, gradients of a 1F1B training pass, the schedule's
order, and the gradient norm over the whole pipeline."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
from _ranks import TIMEOUT, run_ranks
from model_fixtures import tiny_config

from realrl.api.core.data_api import SequenceSample
from realrl.impl.model.nn.real_model import ReaLModel
from realrl.impl.model.parallel.pipeline import (
    PipelineStage,
    StageLinks,
    StageSpec,
    forward_only,
    pipeline_grad_norm,
    train_1f1b,
)

CFG = tiny_config(hf_model_type="llama", n_layers=4)
LENGTHS = [[5, 9], [3], [12, 4, 6], [7, 2]]  # four micro-batches of different token counts


def micro_batches(n: int) -> list[SequenceSample]:
    g = torch.Generator().manual_seed(7)
    out = []
    for i, lens in enumerate(LENGTHS[:n]):
        ids = torch.randint(0, CFG.vocab_size, (sum(lens),), generator=g)
        out.append(
            SequenceSample.from_default(ids=[f"mb{i}"], seqlens=[lens], data={"packed_input_ids": ids})
        )
    return out


def token_loss(logits: torch.Tensor, mb: SequenceSample) -> tuple[torch.Tensor, dict]:
    """Mean next-token loss within each sequence."""
    ids, cu = mb.data["packed_input_ids"], mb.cu_seqlens("packed_input_ids").tolist()
    keep = torch.ones(len(ids) - 1, dtype=torch.bool)
    keep[torch.tensor(cu[1:-1], dtype=torch.long) - 1] = False  # across a sequence boundary
    logp = torch.log_softmax(logits.float()[:-1], -1).gather(-1, ids[1:, None])[:, 0]
    return -(logp * keep).sum() / keep.sum(), {"tokens": float(keep.sum())}


def reference(model: ReaLModel, mbs: list[SequenceSample], scales: list[float]):
    logits = []
    for mb, s in zip(mbs, scales):
        out = model(mb.data["packed_input_ids"], mb.cu_seqlens("packed_input_ids"))
        logits.append(out.detach())
        (token_loss(out, mb)[0] * s).backward()
    return logits, {k: p.grad.clone() for k, p in model.named_parameters()}


def worker(rank: int, n_stages: int) -> dict:
    group = dist.new_group(list(range(n_stages)), timeout=TIMEOUT)
    torch.manual_seed(0)
    whole = ReaLModel(CFG)
    mine = copy.deepcopy(whole)
    spec = StageSpec.of(CFG, rank, n_stages)
    stage = PipelineStage(mine, spec)
    links = StageLinks(group, spec, CFG.hidden_dim)
    result = {"layers": list(spec.layers), "runs": []}
    for m in (1, 2, 4):
        mbs = micro_batches(m)
        scales = [1.0 / (i + 2) for i in range(m)]
        ref_logits, ref_grads = reference(whole, mbs, scales)
        whole.zero_grad(set_to_none=True)
        logits = forward_only(stage, links, mbs)
        stage.schedule_log = []
        losses = train_1f1b(stage, links, mbs, token_loss, scales)
        grads = {k: p.grad.clone() for k, p in mine.named_parameters() if p.grad is not None}
        owned = {k for k, p in mine.named_parameters() if any(p is q for q in stage.parameters())}
        norm = pipeline_grad_norm(list(stage.parameters()), group)
        mine.zero_grad(set_to_none=True)
        result["runs"].append(
            {
                "m": m,
                "logit_diff": max(
                    (float((a - b).abs().max()) for a, b in zip(logits, ref_logits)), default=0.0
                ),
                "n_logits": len(logits),
                "grad_diff": max(float((grads[k] - ref_grads[k]).abs().max()) for k in grads),
                "grads_cover_stage": set(grads) == owned,
                "losses": [loss for loss, _ in losses],
                "ref_losses": [float(token_loss(x, mb)[0]) for x, mb in zip(ref_logits, mbs)],
                "order": stage.schedule_log,
                "norm": norm,
                "ref_norm": float(torch.sqrt(sum(g.pow(2).sum() for g in ref_grads.values()))),
            }
        )
    return result


# three stages have a middle one (receives and sends both ways); two are a subset of that
@pytest.fixture(scope="module", params=[pytest.param(2, marks=pytest.mark.slow), 3], ids=["p2", "p3"])
def results(request, tmp_path_factory):
    n = request.param
    return n, run_ranks(worker, tmp_path_factory.mktemp(f"pipe{n}"), n, n=n)


def test_stages_split_the_layers_and_reproduce_the_whole_model(results):
    n, ranks = results
    assert [i for r in ranks for i in r["layers"]] == list(range(CFG.n_layers))
    for rank, r in enumerate(ranks):
        last = rank == n - 1
        for run in r["runs"]:
            assert run["n_logits"] == (run["m"] if last else 0)
            if last:
                assert run["logit_diff"] < 1e-5, run
                assert run["losses"] == pytest.approx(run["ref_losses"], abs=1e-5)
            assert run["grads_cover_stage"] and run["grad_diff"] < 1e-5, (rank, run["m"], run["grad_diff"])
            # clipping sees the whole model's gradient on every stage
            assert run["norm"] == pytest.approx(run["ref_norm"], rel=1e-5)


def test_the_schedule_is_one_forward_one_backward_after_the_fill(results):
    n, ranks = results
    for rank, r in enumerate(ranks):
        order = next(run["order"] for run in r["runs"] if run["m"] == 4)
        fill = min(n - rank - 1, 4)
        assert order[:fill] == [("F", i) for i in range(fill)]
        assert sorted(order) == sorted([("F", i) for i in range(4)] + [("B", i) for i in range(4)])
        # never more than n - rank micro-batches between their forward and their backward
        alive, most = 0, 0
        for kind, _ in order:
            alive += 1 if kind == "F" else -1
            most = max(most, alive)
        assert most == min(n - rank, 4), (rank, order)
        # backwards in micro-batch order, each after its forward
        assert [i for k, i in order if k == "B"] == list(range(4))
