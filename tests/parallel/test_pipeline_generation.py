"""Generation through pipeline stages over gloo ranks against the single-process generator: the
same tokens and log-probs for every answer (sampled and greedy, several answers per prompt,
answers ending early at EOS), micro-batches of different prompt lengths taking turns."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
from _ranks import TIMEOUT, run_ranks
from model_fixtures import tiny_config

from realrl.api.core.model_api import GenerationHyperparameters
from realrl.impl.model.nn.real_model import ReaLModel
from realrl.impl.model.parallel.pipeline import PipelineStage, StageLinks, StageSpec
from realrl.impl.model.parallel.pipeline_generation import Prompts, generate_pipelined

CFG = tiny_config(hf_model_type="llama", n_layers=4)
EOS = [3, 7, 11, 19]  # common enough that some answers end early
PROMPT_LENGTHS = [[4, 7], [3], [9, 2, 5]]


def micro_batches() -> list[Prompts]:
    g = torch.Generator().manual_seed(3)
    out = []
    for i, lens in enumerate(PROMPT_LENGTHS):
        ids = torch.randint(20, CFG.vocab_size, (sum(lens),), generator=g)
        cu = torch.tensor([0, *lens]).cumsum(0).int()
        out.append(Prompts(ids, cu, torch.arange(len(lens), dtype=torch.long) * 1000 + 17 * i))
    return out


def worker(rank: int, n_stages: int) -> dict:
    group = dist.new_group(list(range(n_stages)), timeout=TIMEOUT)
    torch.manual_seed(0)
    whole = ReaLModel(CFG).eval()
    spec = StageSpec.of(CFG, rank, n_stages)
    stage = PipelineStage(copy.deepcopy(whole), spec).eval()
    links = StageLinks(group, spec, CFG.hidden_dim)
    out = {}
    for name, g in {
        "sampled": GenerationHyperparameters(n=2, max_new_tokens=6, top_p=1.0, top_k=0, temperature=0.9),
        "greedy": GenerationHyperparameters(n=1, max_new_tokens=5, greedy=True),
    }.items():
        mbs = micro_batches()
        got = generate_pipelined(stage, links, mbs, g, EOS)
        want = [whole.generate(p.input_ids, p.cu_seqlens, g, EOS, p.prompt_keys) for p in mbs]
        out[name] = (got, want)
    return out


# the default suite runs generation through 2 and 3 stages behind the engine in test_pipeline_engines.py
@pytest.mark.slow
@pytest.mark.parametrize("n_stages", [2, 3])  # 3 has a middle stage
def test_pipelined_generation_samples_what_one_process_samples(tmp_path, n_stages):
    ranks = run_ranks(worker, tmp_path, n_stages, n=n_stages)
    for rank, r in enumerate(ranks):
        for name, (got, want) in r.items():
            if rank < n_stages - 1:
                assert got == [], (rank, name)  # only the last stage holds the answers
                continue
            assert len(got) == len(want) == len(PROMPT_LENGTHS)
            ended_early = 0
            for a, b in zip(got, want):
                assert a.seqlens == b.seqlens and a.prompt_lens == b.prompt_lens, name
                assert torch.equal(a.sequences, b.sequences), name
                torch.testing.assert_close(a.logprobs, b.logprobs, atol=1e-5, rtol=0)
                assert torch.equal(a.no_eos, b.no_eos)
                ended_early += int((~b.no_eos).sum())
            if name == "sampled":
                assert ended_early > 0  # the EOS path (rows leaving every stage's cache) ran
