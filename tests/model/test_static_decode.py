"""Fixed-shape decoding (what the CUDA graphs capture), run eagerly on the CPU: the same tokens and
log-probs as the eager loop in every sampling mode, finished rows compacted into smaller buckets,
the cache sized from the batch and the length budget."""

from __future__ import annotations

import pytest
import torch
from model_fixtures import make_hf_model, packed, tiny_real_model

from realrl.api.core.model_api import GenerationHyperparameters
from realrl.impl.model.modules.kv_cache import KVCache
from realrl.impl.model.nn.generation import decoding_mode, generate
from realrl.impl.model.nn.real_model import ReaLModel
from realrl.impl.model.nn.static_decode import (
    DecodeState,
    DecodeTrace,
    StaticDecoder,
    batch_buckets,
    bucket_for,
    cache_bytes,
    cache_capacity,
    rehearse,
)

PROMPTS = [5, 9, 3, 6, 1, 7]


def prompts(lengths: list[int], vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids, cu = packed(lengths, seed=5)
    return ids % vocab, cu


def both(model, g: GenerationHyperparameters, eos, lengths=PROMPTS, keys_seed: int = 3):
    """(eager output, static output, static trace) for the same prompts and sampling keys."""
    ids, cu = prompts(lengths, model.config.vocab_size)
    keys = torch.randint(-(2**62), 2**62, (len(lengths),), generator=torch.Generator().manual_seed(keys_seed))
    eager = generate(model, ids, cu, GenerationHyperparameters(**{**vars(g), "decoding": "eager"}), eos, keys)
    trace = DecodeTrace()
    static = generate(
        model, ids, cu, GenerationHyperparameters(**{**vars(g), "decoding": "static"}), eos, keys, trace
    )
    return eager, static, trace


def assert_same(a, b) -> None:
    assert a.seqlens == b.seqlens and a.prompt_lens == b.prompt_lens
    assert torch.equal(a.sequences, b.sequences)
    assert torch.equal(a.no_eos, b.no_eos)
    torch.testing.assert_close(a.logprobs, b.logprobs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "options",
    [
        dict(greedy=True),
        dict(temperature=0.7),
        dict(top_k=5, top_p=0.9),
        dict(min_new_tokens=4, top_p=0.95),
        dict(fixed_length=True),
    ],
    ids=["greedy", "temperature", "top_k_top_p", "min_new_tokens", "fixed_length"],
)
@pytest.mark.parametrize("n", [1, 3])
def test_static_steps_give_the_eager_loops_tokens(options, n):
    model = tiny_real_model()
    # many EOS ids: answers end at varied steps, so rows finish and the batch is compacted
    eos = list(range(1, 9))
    g = GenerationHyperparameters(n=n, max_new_tokens=20, **options)
    eager, static, trace = both(model, g, eos)
    assert_same(eager, static)
    assert len(static.seqlens) == len(PROMPTS) * n
    if not options.get("fixed_length") and n == 3:  # 18 rows: some buckets below 18 were used
        assert trace.buckets[0] == 18 and min(trace.buckets) < 18
        assert trace.buckets == sorted(trace.buckets, reverse=True)
    assert trace.captured == ()  # no CUDA graphs on a CPU


def test_sliding_window_and_a_real_checkpoint_agree(tmp_path):
    """A mistral checkpoint (sliding window 5) loaded like a user's: the window's mask holds over
    the whole static cache."""
    make_hf_model("mistral").save_pretrained(tmp_path / "m")
    model = ReaLModel.from_pretrained(str(tmp_path / "m")).eval()
    g = GenerationHyperparameters(n=2, max_new_tokens=16, temperature=0.9)
    eager, static, _ = both(model, g, [1, 2, 3], lengths=[12, 3, 9])
    assert_same(eager, static)


def test_every_row_finishing_early_stops_the_steps():
    model = tiny_real_model()
    # every token but one ends the answer: all rows finish at the first or second step
    eos = list(range(1, 64))
    g = GenerationHyperparameters(n=2, max_new_tokens=40, min_new_tokens=1)
    eager, static, trace = both(model, g, eos)
    assert_same(eager, static)
    assert len(trace.buckets) == 8  # stopped at the first look at the flags (every 8 steps)


def test_buckets_halve_down_to_one_and_fit_the_live_rows():
    assert batch_buckets(64) == (64, 32, 16, 8, 4, 2, 1)
    assert batch_buckets(100) == (100, 64, 32, 16, 8, 4, 2, 1)
    assert batch_buckets(1) == (1,)
    assert batch_buckets(2) == (2, 1)
    assert [bucket_for(n, batch_buckets(100)) for n in (100, 65, 64, 33, 3, 1)] == [100, 100, 64, 64, 4, 1]
    with pytest.raises(ValueError):
        batch_buckets(0)


def test_cache_is_sized_from_the_batch_and_the_length_budget():
    # the longest prompt, then every new token but the last (sampled, never fed back)
    assert cache_capacity(max_prompt_len=128, max_new_tokens=256) == 383
    # a 1.1B llama (22 layers, 4 KV heads of 64) for 64 answers in bf16: 22 x 2 x 64 x 4 x 383 x 64 x 2
    assert cache_bytes(64, 383, 22, 4, 64, torch.bfloat16) == 2 * 22 * 64 * 4 * 383 * 64 * 2
    model = tiny_real_model()
    ids, cu = prompts([4, 9], model.config.vocab_size)
    trace = DecodeTrace()
    out = generate(
        model, ids, cu, GenerationHyperparameters(n=2, max_new_tokens=5, decoding="static"), None, None, trace
    )
    assert out.seqlens == [9, 9, 14, 14] and trace.buckets == [4] * 5


def test_the_capture_rehearsal_stays_in_bounds_when_few_tokens_are_asked_for():
    """Before capturing, every bucket's step is rehearsed once. 64 rows have 7 buckets; a call for
    2 new tokens from 1-token prompts has 2 output columns and 2 cache slots, so the rehearsals
    must each start from a rewound state (on a GPU the unrewound 5th one indexed out of bounds)."""
    model = tiny_real_model()
    cfg = model.config
    capacity = cache_capacity(max_prompt_len=1, max_new_tokens=2)

    def decoder() -> StaticDecoder:
        cache = KVCache(cfg.n_layers, 64, cfg.n_kv_heads, capacity, cfg.head_dim, torch.float32, "cpu")
        g = GenerationHyperparameters(max_new_tokens=2, decoding="static")
        return StaticDecoder(
            model, cache, cfg.vocab_size, torch.float32, g, torch.tensor([1]), use_graphs=False
        )

    d = decoder()
    assert len(d.buckets) == 7
    rehearse(d._step, d.buckets, d.state.rewind)
    assert d.state.step.item() == 0 and d.state.lens.eq(0).all() and d.state.finished.all()
    assert d.state.out_tokens[:64].eq(0).all()  # rehearsals wrote only to the spare row
    unrewound = decoder()
    with pytest.raises(IndexError):
        rehearse(unrewound._step, unrewound.buckets, lambda: None)


def test_compaction_moves_live_rows_to_the_front_in_place():
    state = DecodeState.empty(rows=6, vocab=3, max_new=4, logits_dtype=torch.float32, device="cpu")
    state.start(torch.arange(18.0).view(6, 3), torch.tensor([5, 6, 7, 8, 9, 10]), torch.arange(6) * 100)
    cache = KVCache(1, 6, 1, 4, 2, torch.float32, "cpu")
    cache.k[0].copy_(torch.arange(6.0).view(6, 1, 1, 1).expand(6, 1, 4, 2))
    addresses = [t.data_ptr() for t in (state.lens, state.logits, cache.k[0])]
    state.finished[[0, 2, 3]] = True
    live = (~state.finished).nonzero().squeeze(-1)  # rows 1, 4, 5
    state.compact_(cache, live, bucket=4)
    assert state.lens[:3].tolist() == [6, 9, 10] and state.keys[:3].tolist() == [100, 400, 500]
    assert state.seq.tolist()[:4] == [1, 4, 5, state.spare] and state.finished[:4].tolist() == [False] * 3 + [
        True
    ]
    assert state.logits[:3, 0].tolist() == [3.0, 12.0, 15.0]
    assert cache.k[0][:3, 0, 0, 0].tolist() == [1.0, 4.0, 5.0]
    assert addresses == [
        t.data_ptr() for t in (state.lens, state.logits, cache.k[0])
    ]  # graphs keep reading them


def test_auto_is_eager_on_the_cpu_and_cuda_graphs_need_cuda():
    model = tiny_real_model()
    cpu = torch.device("cpu")
    assert decoding_mode(model, GenerationHyperparameters(), cpu) == "eager"
    assert decoding_mode(model, GenerationHyperparameters(decoding="static"), cpu) == "static"
    assert decoding_mode(model, GenerationHyperparameters(), torch.device("cuda")) == "cuda_graph"
    with pytest.raises(ValueError, match="needs a CUDA device"):
        decoding_mode(model, GenerationHyperparameters(decoding="cuda_graph"), cpu)
    with pytest.raises(ValueError, match="decoding must be one of"):
        GenerationHyperparameters(decoding="fast")


def test_a_failed_capture_decodes_eagerly_under_auto_and_raises_when_asked_for(monkeypatch):
    from realrl.impl.model.nn import static_decode
    from realrl.impl.model.nn.generation import static_decoder

    class UncapturableStep:
        def __init__(self, *args, **kwargs):
            raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(static_decode, "StepGraphs", UncapturableStep)  # what a capture failure raises
    model = tiny_real_model()
    cache = KVCache(2, 4, 2, 12, 8, torch.float32, "cpu")
    eos = torch.tensor([1])
    auto = GenerationHyperparameters(max_new_tokens=4)
    assert static_decoder(model, cache, torch.float32, auto, eos, "cuda_graph", None) is None
    asked = GenerationHyperparameters(max_new_tokens=4, decoding="cuda_graph")
    with pytest.raises(RuntimeError, match="not permitted when stream is capturing"):
        static_decoder(model, cache, torch.float32, asked, eos, "cuda_graph", None)
    assert static_decoder(model, cache, torch.float32, auto, eos, "static", None) is not None
