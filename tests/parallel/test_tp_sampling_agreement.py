"""The tensor-parallel ranks of a replica sample the same tokens by construction, not by luck: each
rank samples from its own logits (on a GPU with a CDF that is not bit-deterministic), and one
disagreement would split the ranks' batches. Here the ranks are made to disagree (each draws with
other sampling keys, as if its random numbers or logits differed) and still end with rank 0's
tokens, with and without EOS ending rows at different steps (2 gloo processes, d1m2p1)."""

from __future__ import annotations

import torch
from _ranks import TIMEOUT, run_ranks
from model_fixtures import packed, tiny_config

from realrl.api.core.layout import Layout, Placement
from realrl.api.core.model_api import GenerationHyperparameters
from realrl.impl.model.nn.generation import generate, sampling_group
from realrl.impl.model.nn.real_model import ReaLModel
from realrl.impl.model.parallel.apply import parallelize
from realrl.impl.model.parallel.mesh import build_contexts

PROMPT_KEYS = torch.tensor([11, 22, 33], dtype=torch.long)
SAMPLED = GenerationHyperparameters(n=2, max_new_tokens=10, temperature=1.0)
EOS_IDS = [1, 2, 3, 4]  # of a 64-token vocabulary: rows end at varied steps


def _model() -> ReaLModel:
    torch.manual_seed(0)
    return ReaLModel(tiny_config()).eval()


def _prompts(vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids, cu = packed([5, 2, 8], seed=2)
    return ids % vocab, cu


def worker(rank: int) -> dict:
    parallel = build_contexts({"m": Placement(Layout(1, 2, 1), (0, 1))}, rank, "cpu", TIMEOUT)["m"]
    whole, split = _model(), _model()
    parallelize(split, parallel)
    ids, cu = _prompts(whole.config.vocab_size)
    keys = PROMPT_KEYS + 1000 * rank  # this rank's own draws: the ranks disagree unless they agree
    result = {"whole_group": sampling_group(whole), "has_group": sampling_group(split) is not None}
    for name, eos in (("no_eos", None), ("eos", EOS_IDS)):
        out = generate(split, ids, cu, SAMPLED, eos_token_id=eos, prompt_keys=keys)
        result[name] = (out.sequences.clone(), out.logprobs.clone(), list(out.seqlens))
    return result


def _whole_model_answers(keys: torch.Tensor, eos) -> tuple[torch.Tensor, torch.Tensor]:
    model = _model()
    ids, cu = _prompts(model.config.vocab_size)
    out = generate(model, ids, cu, SAMPLED, eos_token_id=eos, prompt_keys=keys)
    return out.sequences, out.logprobs


def test_tensor_parallel_ranks_take_the_first_ranks_tokens(tmp_path):
    first, second = run_ranks(worker, tmp_path)
    assert first["whole_group"] is None and second["whole_group"] is None  # one rank: no collective
    assert first["has_group"] and second["has_group"]
    for name, eos in (("no_eos", None), ("eos", EOS_IDS)):
        tokens, logprobs, seqlens = first[name]
        assert torch.equal(tokens, second[name][0]) and seqlens == second[name][2], name
        torch.testing.assert_close(logprobs, second[name][1], rtol=0, atol=1e-5)
        # they are rank 0's draws (the whole model's with rank 0's keys), and rank 1's own draws
        # would have been others: the agreement was needed
        want, want_logp = _whole_model_answers(PROMPT_KEYS, eos)
        assert torch.equal(tokens, want), name
        torch.testing.assert_close(logprobs, want_logp, rtol=0, atol=1e-5)
        assert not torch.equal(_whole_model_answers(PROMPT_KEYS + 1000, eos)[0], want), name
