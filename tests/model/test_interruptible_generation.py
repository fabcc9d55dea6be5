"""Generation that pauses between tokens (partial rollouts): decoded in pieces it samples exactly
what one uninterrupted decoding does; after the weights change, the unfinished answers continue
under the new ones (their caches recomputed), and every token keeps the version that sampled it."""

from __future__ import annotations

import torch
from model_fixtures import VOCAB, packed, tiny_config

from realrl.api.core.data_api import MicroBatchSpec, SequenceSample
from realrl.api.core.model_api import GenerationHyperparameters
from realrl.impl.interface.ppo_rollout import answer_version_span
from realrl.impl.model.backend.engine import InferenceEngine
from realrl.impl.model.nn.generation import start_decoding
from realrl.impl.model.nn.real_model import ReaLModel
from realrl.impl.model.utils.functional import gather_packed_shifted_log_probs

PROMPTS = [5, 9, 3, 6]
EOS = [1, 2, 3]  # a few ids end answers early: rows leave the batch at different steps
SAMPLED = GenerationHyperparameters(max_new_tokens=12, n=2, top_k=0, top_p=1.0)
GREEDY = GenerationHyperparameters(max_new_tokens=12, greedy=True)


def _model(seed: int) -> ReaLModel:
    torch.manual_seed(seed)
    return ReaLModel(
        tiny_config(vocab_size=VOCAB), initializer_range=0.5
    ).eval()  # peaked, unequal distributions


def _keys() -> torch.Tensor:
    return torch.tensor([11, -7, 2**40 + 3, 5], dtype=torch.long)


@torch.no_grad()
def test_decoding_in_pieces_samples_exactly_what_one_decoding_does():
    model, (ids, cu) = _model(0), packed(PROMPTS, seed=3)
    whole = model.generate(ids, cu, SAMPLED, eos_token_id=EOS, prompt_keys=_keys())
    decoding = start_decoding(model, ids, cu, SAMPLED, EOS, _keys())
    pieces = 0
    while decoding.advance(3, version=pieces):
        pieces += 1
    out = decoding.output()
    assert pieces >= 2  # it did pause
    assert torch.equal(out.sequences, whole.sequences) and out.seqlens == whole.seqlens
    assert torch.equal(out.logprobs, whole.logprobs) and torch.equal(out.no_eos, whole.no_eos)


@torch.no_grad()
def test_recomputing_the_caches_under_the_same_weights_changes_nothing():
    model, (ids, cu) = _model(0), packed(PROMPTS, seed=3)
    whole = model.generate(ids, cu, SAMPLED, eos_token_id=EOS, prompt_keys=_keys())
    decoding = start_decoding(model, ids, cu, SAMPLED, EOS, _keys())
    decoding.advance(4, version=0)
    assert decoding.n_live > 0
    decoding.refresh()
    decoding.advance(None, version=0)
    out = decoding.output()
    assert torch.equal(out.sequences, whole.sequences)
    torch.testing.assert_close(out.logprobs, whole.logprobs, rtol=0, atol=1e-5)


@torch.no_grad()
def test_after_new_weights_the_answers_continue_under_them_each_token_tagged():
    """Greedy: the first 4 answer tokens are the old model's, the rest the new model's greedy
    continuation of (prompt + those 4), with the new model's log-probs."""
    old, new = _model(0), _model(1)
    ids, cu = packed(PROMPTS, seed=3)
    model = _model(0)
    decoding = start_decoding(model, ids, cu, GREEDY, None)
    decoding.advance(4, version=7)
    model.load_state_dict(new.state_dict())  # a newer policy arrives mid-decoding
    decoding.refresh()
    decoding.advance(None, version=8)
    out, versions = decoding.output(), decoding.token_versions()

    first = old.generate(ids, cu, greedy_for(4), eos_token_id=None)
    prefix = torch.split(first.sequences, first.seqlens)
    cont_cu = torch.tensor([0, *first.seqlens]).cumsum(0).int()
    rest = new.generate(first.sequences, cont_cu, greedy_for(8), eos_token_id=None)
    want = torch.split(rest.sequences, rest.seqlens)
    got = torch.split(out.sequences, out.seqlens)
    for i, p in enumerate(PROMPTS):
        assert got[i][: p + 4].tolist() == prefix[i].tolist()
        assert got[i].tolist() == want[i].tolist()

    logits = new(out.sequences, torch.tensor([0, *out.seqlens]).cumsum(0).int())
    recomputed = gather_packed_shifted_log_probs(
        logits, torch.tensor([0, *out.seqlens]).cumsum(0).int(), out.sequences
    )
    offsets = torch.tensor([0, *[L - 1 for L in out.seqlens]]).cumsum(0)
    for i, p in enumerate(PROMPTS):
        start = int(offsets[i]) + p - 1
        answer_versions = versions[start : int(offsets[i + 1])]
        assert answer_versions.tolist() == [7] * 4 + [8] * 8
        later = slice(start + 4, int(offsets[i + 1]))
        torch.testing.assert_close(out.logprobs[later], recomputed[later], rtol=0, atol=1e-5)
    oldest, newest = answer_version_span(out, versions)
    assert oldest.tolist() == [7] * 4 and newest.tolist() == [8] * 4


def greedy_for(n: int) -> GenerationHyperparameters:
    return GenerationHyperparameters(max_new_tokens=n, greedy=True)


@torch.no_grad()
def test_an_uninterrupted_session_of_the_engine_is_its_eager_generate():
    """Through the engine, in 2 micro-batches, keyed by sample id: the same answers."""
    engine = InferenceEngine(_model(0))
    ids, _ = packed(PROMPTS, seed=3)
    data = SequenceSample.from_default(
        ids=["a", "b", "c", "d"], seqlens=PROMPTS, data={"packed_prompts": ids}
    )
    g = GenerationHyperparameters(max_new_tokens=12, n=2, top_k=0, top_p=1.0, decoding="eager")

    class Tok:
        eos_token_id = EOS

    mbs = MicroBatchSpec(n_mbs=2)
    torch.manual_seed(5)
    whole = engine.generate(data, mbs, Tok, g)
    torch.manual_seed(5)  # the call's one base seed: the same draw
    session = engine.start_generation(data, mbs, Tok, g)
    while session.advance(5, version=0):
        pass
    out, versions = session.output()
    assert torch.equal(out.sequences, whole.sequences) and torch.equal(out.logprobs, whole.logprobs)
    assert versions.shape == out.logprobs.shape and int(versions.abs().sum()) == 0
    assert session.versions[0] == 0 and len(session.versions) >= 2
