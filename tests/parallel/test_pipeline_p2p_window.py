"""The pipeline schedules under NCCL's point-to-point rules (``p2p_window.py``: a send waits once
two messages toward its peer have no receive posted there; messages match pairwise in order,
shape and dtype), over 2 and 3 gloo stages: pipelined generation with more micro-batches than
the window, and inference and 1F1B training, each against the single-process model."""

from __future__ import annotations

import copy
import os

import pytest
import torch
import torch.distributed as dist
from _ranks import TIMEOUT, run_ranks
from p2p_window import windowed_p2p
from test_pipeline import micro_batches as training_batches
from test_pipeline import reference, token_loss
from test_pipeline_generation import CFG, EOS

from realrl.api.core.model_api import GenerationHyperparameters
from realrl.impl.model.nn.real_model import ReaLModel
from realrl.impl.model.parallel.pipeline import PipelineStage, StageLinks, StageSpec, forward_only, train_1f1b
from realrl.impl.model.parallel.pipeline_generation import Prompts, generate_pipelined

N_PROMPT_MBS = 6  # three times the window: a schedule that posts them all before a receive hangs
SAMPLED = GenerationHyperparameters(n=2, max_new_tokens=4, top_p=1.0, top_k=0, temperature=0.9)


def prompts() -> list[Prompts]:
    g = torch.Generator().manual_seed(5)
    out = []
    for i in range(N_PROMPT_MBS):
        lens = torch.randint(2, 9, (1 + i % 3,), generator=g).tolist()
        ids = torch.randint(20, CFG.vocab_size, (sum(lens),), generator=g)
        cu = torch.tensor([0, *lens]).cumsum(0).int()
        out.append(Prompts(ids, cu, torch.arange(len(lens), dtype=torch.long) * 1000 + 31 * i))
    return out


def worker(rank: int, n_stages: int, store_path: str) -> dict:
    group = dist.new_group(list(range(n_stages)), timeout=TIMEOUT)
    torch.manual_seed(0)
    whole = ReaLModel(CFG)
    mine = copy.deepcopy(whole)
    spec = StageSpec.of(CFG, rank, n_stages)
    stage = PipelineStage(mine, spec)
    links = StageLinks(group, spec, CFG.hidden_dim, p2p=windowed_p2p(store_path, n_stages))

    whole.eval(), stage.eval()
    mbs = prompts()
    got = generate_pipelined(stage, links, mbs, SAMPLED, EOS)
    want = [whole.generate(p.input_ids, p.cu_seqlens, SAMPLED, EOS, p.prompt_keys) for p in mbs]

    whole.train(), stage.train()
    batches = training_batches(4)
    scales = [1.0 / (i + 2) for i in range(4)]
    ref_logits, ref_grads = reference(whole, batches, scales)
    logits = forward_only(stage, links, batches)
    losses = train_1f1b(stage, links, batches, token_loss, scales)
    grads = {k: p.grad for k, p in mine.named_parameters() if p.grad is not None}
    return {
        "generated": (got, want),
        "logit_diff": max((float((a - b).abs().max()) for a, b in zip(logits, ref_logits)), default=0.0),
        "losses": (
            [loss for loss, _ in losses],
            [float(token_loss(x, mb)[0]) for x, mb in zip(ref_logits, batches)],
        ),
        "grad_diff": max(float((g - ref_grads[k]).abs().max()) for k, g in grads.items()),
    }


# 3 stages have a middle one (receives and sends both ways); 2 are a subset of that
@pytest.mark.parametrize("n_stages", [pytest.param(2, marks=pytest.mark.slow), 3])
def test_the_schedules_need_no_buffering(tmp_path, n_stages):
    ranks = run_ranks(worker, tmp_path, n_stages, os.path.join(tmp_path, "store"), n=n_stages)
    for rank, r in enumerate(ranks):
        got, want = r["generated"]
        assert r["grad_diff"] < 1e-5, (rank, r["grad_diff"])
        if rank < n_stages - 1:
            assert got == [] and r["losses"][0] == []
            continue
        assert r["logit_diff"] < 1e-5
        assert r["losses"][0] == pytest.approx(r["losses"][1], abs=1e-5)
        assert len(got) == len(want) == N_PROMPT_MBS
        for a, b in zip(got, want):
            assert a.seqlens == b.seqlens and a.prompt_lens == b.prompt_lens
            assert torch.equal(a.sequences, b.sequences)
            torch.testing.assert_close(a.logprobs, b.logprobs, atol=1e-5, rtol=0)
            assert torch.equal(a.no_eos, b.no_eos)
