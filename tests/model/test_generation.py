"""KV-cache generation over packed prompts: greedy equals transformers, log-probs equal a forward."""

from __future__ import annotations

import pytest
import torch
from model_fixtures import make_hf_model, packed

from realrl.api.core.model_api import GenerationHyperparameters
from realrl.impl.model.nn.real_model import ReaLModel
from realrl.impl.model.utils.functional import gather_packed_shifted_log_probs

PROMPTS = [5, 9, 3, 6]
EOS = 1


def _load(kind: str, tmp_path, seed: int = 0) -> tuple:
    hf = make_hf_model(kind, seed)
    hf.save_pretrained(tmp_path / kind)
    return hf, ReaLModel.from_pretrained(str(tmp_path / kind)).eval()


def _split(x: torch.Tensor, lens: list[int]) -> list[list[int]]:
    return [t.tolist() for t in torch.split(x, lens)]


@pytest.mark.parametrize("kind", ["llama", "qwen3", "mistral", "gpt2"])
def test_greedy_equals_transformers(kind, tmp_path):
    hf, model = _load(kind, tmp_path)
    ids, cu = packed(PROMPTS, seed=5)
    g = GenerationHyperparameters(max_new_tokens=10, greedy=True)
    out = model.generate(ids, cu, g, eos_token_id=EOS)
    ours = _split(out.sequences, out.seqlens)
    for i, prompt in enumerate(_split(ids, PROMPTS)):
        ref = hf.generate(
            torch.tensor([prompt]), max_new_tokens=10, do_sample=False, eos_token_id=EOS, pad_token_id=0
        )
        assert ours[i] == ref[0].tolist(), f"{kind} prompt {i}"
    assert out.prompt_lens == PROMPTS


def _recomputed_logprobs(model, out, temperature: float) -> torch.Tensor:
    cu = torch.zeros(len(out.seqlens) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(out.seqlens).cumsum(0)
    with torch.no_grad():
        logits = model(out.sequences, cu) / temperature
    return gather_packed_shifted_log_probs(logits, cu, out.sequences)


@pytest.mark.parametrize("top_k,top_p", [(0, 1.0), (5, 1.0), (0, 0.8)])
def test_sampled_logprobs_equal_forward_recomputation(tmp_path, top_k, top_p):
    _, model = _load("llama", tmp_path)
    ids, cu = packed(PROMPTS, seed=6)
    g = GenerationHyperparameters(n=3, max_new_tokens=8, temperature=0.7, top_k=top_k, top_p=top_p)
    torch.manual_seed(0)
    out = model.generate(ids, cu, g, eos_token_id=EOS)
    assert len(out.seqlens) == 3 * len(PROMPTS)
    assert out.logprobs.shape[0] == sum(out.seqlens) - len(out.seqlens)
    ref = _recomputed_logprobs(model, out, 0.7)
    prompt_pos = out.prompt_mask()[torch.cat([torch.arange(1, L) + s for L, s in _starts(out.seqlens)])]
    assert torch.all(out.logprobs[prompt_pos] == 0)
    assert (out.logprobs[~prompt_pos] - ref[~prompt_pos]).abs().max().item() < 1e-4
    # prompt-major: the 3 answers of prompt i all start with prompt i
    prompts = _split(ids, PROMPTS)
    for j, seq in enumerate(_split(out.sequences, out.seqlens)):
        assert seq[: PROMPTS[j // 3]] == prompts[j // 3]


def _starts(seqlens):
    s = 0
    for L in seqlens:
        yield L, s
        s += L


def test_eos_stops_and_no_eos_mask(tmp_path):
    _, model = _load("llama", tmp_path)
    ids, cu = packed(PROMPTS, seed=7)
    g = GenerationHyperparameters(n=4, max_new_tokens=30, temperature=3.0)
    stops = range(1, 6)  # several EOS ids: most rows stop early, a few run to the end (any seed in 0-5)
    torch.manual_seed(1)
    out = model.generate(ids, cu, g, eos_token_id=list(stops))
    responses = [s[p:] for s, p in zip(_split(out.sequences, out.seqlens), out.prompt_lens)]
    stopped = [r[-1] in stops for r in responses]
    assert any(stopped) and not all(stopped)
    for r, ne in zip(responses, out.no_eos.tolist()):
        assert all(t not in stops for t in r[:-1])  # nothing after the first EOS
        assert ne == (r[-1] not in stops)
        if ne:
            assert len(r) == 30


def test_min_new_tokens_masks_eos_and_fixed_length_runs_on(tmp_path):
    _, model = _load("llama", tmp_path)
    ids, cu = packed(PROMPTS, seed=8)
    eos = list(range(1, 30))  # a third of the vocabulary ends a sequence
    torch.manual_seed(2)
    out = model.generate(ids, cu, GenerationHyperparameters(n=2, max_new_tokens=12, min_new_tokens=6), eos)
    responses = [s[p:] for s, p in zip(_split(out.sequences, out.seqlens), out.prompt_lens)]
    assert all(len(r) >= 6 and all(t not in eos for t in r[:6]) for r in responses)
    assert any(len(r) < 12 for r in responses)
    torch.manual_seed(2)
    fixed = model.generate(ids, cu, GenerationHyperparameters(n=2, max_new_tokens=12, fixed_length=True), eos)
    assert all(L - p == 12 for L, p in zip(fixed.seqlens, fixed.prompt_lens))
    fixed_resp = [s[p:] for s, p in zip(_split(fixed.sequences, fixed.seqlens), fixed.prompt_lens)]
    assert any(any(t in eos for t in r[:-1]) for r in fixed_resp)  # sampled on past an EOS
    assert fixed.no_eos.tolist() == [not any(t in eos for t in r) for r in fixed_resp]


def test_generation_matches_unbatched_generation(tmp_path):
    """Dropping finished rows and packing prompts does not change any sequence's greedy output."""
    _, model = _load("qwen2", tmp_path)
    ids, cu = packed(PROMPTS, seed=9)
    g = GenerationHyperparameters(max_new_tokens=9, greedy=True)
    eos = list(range(1, 20))
    together = _split(*(lambda o: (o.sequences, o.seqlens))(model.generate(ids, cu, g, eos)))
    for i, prompt in enumerate(_split(ids, PROMPTS)):
        alone = model.generate(
            torch.tensor(prompt), torch.tensor([0, len(prompt)], dtype=torch.int32), g, eos
        )
        assert alone.sequences.tolist() == together[i]


def test_fp32_weights_under_bf16_autocast_forward_and_generate(tmp_path):
    """The train engine's mixed precision: fp32 master weights, bf16 autocast. Rotary tables and
    the KV cache follow the projections' dtype (bf16), not the weights'; outputs stay close to
    the fp32 model's."""
    _, model = _load("llama", tmp_path)
    ids, cu = packed(PROMPTS, seed=5)
    with torch.no_grad():
        ref = model(ids, cu)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = model(ids, cu)
            out = model.generate(ids, cu, GenerationHyperparameters(max_new_tokens=6, greedy=True), EOS)
    assert low.dtype == torch.bfloat16
    assert (low.float() - ref).abs().max().item() < 0.05 * ref.abs().max().item()
    assert len(out.seqlens) == len(PROMPTS) and out.sequences.dtype == torch.long
    # the prompts come back unchanged at the head of each sequence
    seqs = _split(out.sequences, out.seqlens)
    assert [s[:n] for s, n in zip(seqs, PROMPTS)] == _split(ids, PROMPTS)
