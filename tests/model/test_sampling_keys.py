"""Counter-based sampling: a sampled answer is a function of (base seed, sample id, prompt index,
answer index, step) only, so it does not change with micro-batching, sample order or replicas."""

from __future__ import annotations

import pytest
import torch
from model_fixtures import tiny_config

from realrl.api.core.data_api import MicroBatchSpec, SequenceSample
from realrl.api.core.model_api import GenerationHyperparameters, GenerationOutput
from realrl.impl.model.backend.engine import InferenceEngine, prompt_keys
from realrl.impl.model.nn.real_model import ReaLModel
from realrl.impl.model.nn.sampling import answer_keys, mix64, random_keys, row_uniforms, sample_categorical

MASK64 = (1 << 64) - 1


def _splitmix64_finalizer(z: int) -> int:
    """The reference on Python ints ("Fast splittable pseudorandom number generators")."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def test_mix64_is_splitmix64_with_logical_shifts():
    # splitmix64 seeded with 0: its first output is mix(0x9E3779B97F4A7C15) = 0xE220A8397B1DCDAF
    assert _splitmix64_finalizer(0x9E3779B97F4A7C15) == 0xE220A8397B1DCDAF
    g = torch.Generator().manual_seed(0)
    x = torch.randint(-(2**63), 2**63 - 1, (2000,), generator=g)
    x = torch.cat([x, torch.tensor([0, 1, -1, -(2**63), 2**63 - 1])])  # sign bit set: shifts are logical
    got = [v & MASK64 for v in mix64(x).tolist()]
    assert got == [_splitmix64_finalizer(v & MASK64) for v in x.tolist()]


def test_row_uniforms_are_uniform_and_vary_with_key_and_step():
    keys = torch.arange(200_000)  # related keys: the hash must decorrelate them
    u0, u1 = row_uniforms(keys, 0), row_uniforms(keys, 1)
    assert u0.dtype == torch.float64 and u0.shape == keys.shape
    assert 0.0 <= float(u0.min()) and float(u0.max()) < 1.0
    for u in (u0, u1):
        assert abs(float(u.mean()) - 0.5) < 0.003  # ~4.5 standard errors
        assert abs(float(u.var()) - 1 / 12) < 0.002
        hist = torch.histc(u.float(), bins=20, min=0.0, max=1.0)
        chi2 = float(((hist - len(u) / 20) ** 2 / (len(u) / 20)).sum())
        assert chi2 < 60  # 19 degrees of freedom
    assert float((u0 == u1).double().mean()) < 1e-4  # another step, other numbers
    assert abs(float(torch.corrcoef(torch.stack([u0, u1]))[0, 1])) < 0.01
    assert abs(float(torch.corrcoef(torch.stack([u0[:-1], u0[1:]]))[0, 1])) < 0.01  # neighbouring keys
    assert len(torch.unique(u0)) == len(u0)
    # a pure function of (key, step): another batch, order or a tensor step gives the same values
    perm = torch.randperm(len(keys), generator=torch.Generator().manual_seed(1))[:1000]
    assert torch.equal(row_uniforms(keys[perm], 0), u0[perm])
    assert torch.equal(row_uniforms(keys, torch.tensor(1)), u1)


def test_answer_keys_depend_on_the_prompt_key_and_answer_index_only():
    keys = random_keys(5)
    a = answer_keys(keys, 3)
    assert a.shape == (15,) and len(torch.unique(a)) == 15
    assert torch.equal(answer_keys(keys[2:3], 3), a[6:9])
    assert torch.equal(answer_keys(keys, 1), answer_keys(keys, 4).view(5, 4)[:, 0])


def test_random_keys_follow_the_torch_seed():
    torch.manual_seed(3)
    a = random_keys(4)
    torch.manual_seed(3)
    assert torch.equal(a, random_keys(4))
    assert not torch.equal(a, random_keys(4))


# -- through ReaLModel and the inference engine ------------------------------------------------

# sample id -> its prompts (the last sample holds two)
PROMPTS = {
    "a": [[5, 9, 3]],
    "b": [[7, 2]],
    "c": [[11, 4, 8, 20, 6]],
    "d": [[3]],
    "e": [[9, 9, 30, 2]],
    "f": [[4, 5], [6]],
}


class Tok:
    eos_token_id = list(range(1, 8))  # ~1/9 of a step's mass ends a sequence: rows leave the batch


def _batch(order: list[str]) -> SequenceSample:
    seqs = [PROMPTS[i] for i in order]
    return SequenceSample.from_default(
        ids=order,
        seqlens=[[len(p) for p in s] for s in seqs],
        data={"packed_prompts": torch.tensor([t for s in seqs for p in s for t in p])},
    )


def _per_sample(batch: SequenceSample, out: GenerationOutput, n: int) -> dict[str, list]:
    """sample id -> [(answer tokens, their log-probs)] in (prompt, answer) order."""
    seqs = torch.split(out.sequences, out.seqlens)
    cu = [0]
    for L in out.seqlens:
        cu.append(cu[-1] + L - 1)
    result, k = {}, 0
    for sid, lens in zip(batch.ids, batch.seqlens["packed_prompts"]):
        answers = []
        for _ in range(len(lens) * n):
            p = out.prompt_lens[k]
            answers.append((seqs[k][p:].tolist(), out.logprobs[cu[k] + p - 1 : cu[k + 1]]))
            k += 1
        result[sid] = answers
    return result


@pytest.fixture(scope="module")
def engine() -> InferenceEngine:
    torch.manual_seed(0)
    model = ReaLModel(tiny_config(vocab_size=40), initializer_range=0.5)  # peaked, unequal distributions
    return InferenceEngine(model)


def _generate(engine, order, mb_spec, g, seed) -> dict[str, list]:
    batch = _batch(order)
    torch.manual_seed(seed)
    return _per_sample(batch, engine.generate(batch, mb_spec, Tok(), g), g.n)


def _assert_same(x: dict[str, list], y: dict[str, list]) -> None:
    assert x.keys() == y.keys()
    for sid in x:
        assert [t for t, _ in x[sid]] == [t for t, _ in y[sid]], sid
        for (_, lx), (_, ly) in zip(x[sid], y[sid]):
            torch.testing.assert_close(lx, ly, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("top_k,top_p,min_new", [(0, 1.0, 0), (8, 1.0, 0), (0, 0.9, 3)])
def test_engine_samples_do_not_depend_on_split_or_order(engine, top_k, top_p, min_new):
    g = GenerationHyperparameters(
        n=2, max_new_tokens=10, min_new_tokens=min_new, temperature=1.0, top_k=top_k, top_p=top_p
    )
    order = list(PROMPTS)
    whole = _generate(engine, order, None, g, seed=7)
    _assert_same(whole, _generate(engine, order, MicroBatchSpec(n_mbs=2), g, seed=7))
    _assert_same(whole, _generate(engine, order[::-1], None, g, seed=7))
    _assert_same(whole, _generate(engine, order[::-1], MicroBatchSpec(n_mbs=3), g, seed=7))
    # two replicas, each holding half of the batch (seeded alike), give the same answers
    halves = {
        **_generate(engine, order[:3], None, g, seed=7),
        **_generate(engine, order[3:], None, g, seed=7),
    }
    _assert_same(whole, halves)
    # the test is not vacuous: lengths vary (rows left the batch) and answers to one prompt differ
    answers = [t for a in whole.values() for t, _ in a]
    assert len({len(t) for t in answers}) > 1
    assert any(a[0][0] != a[1][0] for a in whole.values())
    # another base seed, other samples
    other = _generate(engine, order, None, g, seed=8)
    assert [t for a in other.values() for t, _ in a] != answers


def test_engine_prompt_keys_are_per_sample_and_seeded():
    batch = _batch(list(PROMPTS))
    torch.manual_seed(4)
    base = int(random_keys(1))
    torch.manual_seed(4)
    assert int(random_keys(1)) == base
    keys = prompt_keys(base, batch)
    assert keys.dtype == torch.long and keys.shape == (7,) and len(torch.unique(keys)) == 7
    # a sample's keys are the same in any batch that holds it; another base changes all of them
    assert torch.equal(prompt_keys(base, _batch(["f", "a"])), keys[[5, 6, 0]])
    assert not torch.isin(prompt_keys(base + 1, batch), keys).any()


def test_model_generate_with_keys_is_per_prompt():
    """Directly on ReaLModel: a prompt's answers depend on its key, not on the other prompts."""
    torch.manual_seed(0)
    model = ReaLModel(tiny_config(vocab_size=40), initializer_range=0.5).eval()
    g = GenerationHyperparameters(n=3, max_new_tokens=6, top_k=10)
    ids = torch.tensor([5, 9, 3, 7, 2, 11])
    keys = torch.tensor([123, -456], dtype=torch.long)
    both = model.generate(ids, torch.tensor([0, 3, 6], dtype=torch.int32), g, [1, 2], prompt_keys=keys)
    alone = model.generate(ids[3:], torch.tensor([0, 3], dtype=torch.int32), g, [1, 2], prompt_keys=keys[1:])
    second = sum(both.seqlens[:3])
    assert both.sequences[second:].tolist() == alone.sequences.tolist()
    torch.testing.assert_close(both.logprobs[second - 3 :], alone.logprobs, rtol=1e-5, atol=1e-5)
    # without keys: drawn from the global RNG, reproducible under torch.manual_seed
    cu = torch.tensor([0, 3, 6], dtype=torch.int32)
    torch.manual_seed(9)
    x = model.generate(ids, cu, g, [1, 2])
    torch.manual_seed(9)
    assert torch.equal(x.sequences, model.generate(ids, cu, g, [1, 2]).sequences)
    with pytest.raises(ValueError, match="prompt_keys"):
        model.generate(ids, cu, g, [1, 2], prompt_keys=keys[:1])


@pytest.mark.gpu
def test_row_uniforms_on_cuda_match_cpu_without_sync_and_in_a_cuda_graph():
    keys = random_keys(4096)
    want = row_uniforms(keys, 7)
    probs = torch.tensor([0.5, 0.0, 0.25, 0.25]).expand(4096, 4)  # exact CDF on either device
    keys_d, probs_d = keys.cuda(), probs.cuda()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = row_uniforms(keys_d, 7)
        tokens = sample_categorical(probs_d, got)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.equal(got.cpu(), want)
    assert torch.equal(tokens.cpu(), sample_categorical(probs, want))
    # captured once with a step tensor, replayed for other steps
    step = torch.zeros((), dtype=torch.long, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        row_uniforms(keys_d, step)  # warm-up outside the graph
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = row_uniforms(keys_d, step)
    for s in (3, 7):
        step.fill_(s)
        graph.replay()
        assert torch.equal(out.cpu(), row_uniforms(keys, s))
