"""Every registered family in bf16 on the CPU, both ways the engines run it: fp32 master weights
under ``torch.autocast`` (the train engine: training, forward and generation) and the module cast to
bf16 (the inference engine). Queries, keys and values reach attention in one dtype, the KV cache
is written in its own dtype, and outputs stay finite and close to the fp32 run.

The per-head q/k RMSNorm (qwen3) multiplied an fp32 weight by bf16 rows and so handed fp32
queries and keys to attention next to bf16 values: the KV-cache write failed, and the CUDA varlen
kernels take one dtype only."""

from __future__ import annotations

import types

import pytest
import torch
from model_fixtures import FAMILIES, make_hf_model

from realrl.api.core.data_api import MicroBatchSpec, SequenceSample
from realrl.api.core.model_api import GenerationHyperparameters
from realrl.impl.model.backend.config import EngineConfig, OptimizerConfig
from realrl.impl.model.backend.engine import InferenceEngine
from realrl.impl.model.backend.train_engine import TrainEngine
from realrl.impl.model.modules import kv_cache
from realrl.impl.model.modules.attention import check_one_dtype
from realrl.impl.model.nn.real_model import ReaLModel
from realrl.impl.model.utils.functional import gather_packed_shifted_log_probs

LENGTHS = [7, 12, 4, 9]
PROMPTS = [5, 8, 3]
EOS = 1
TOKENIZER = types.SimpleNamespace(eos_token_id=EOS)
# bf16 against fp32 on these 2-layer models (measured, worst over the families: 0.014 relative
# on logits and values, 0.017 on a generated token's log-prob, gradient cosine 0.99993)
REL_TOLERANCE = 0.05
LOGP_TOLERANCE = 0.05  # |log-prob of a generated token, bf16 run - fp32 forward|


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("families")
    for kind in FAMILIES:
        make_hf_model(kind).save_pretrained(root / kind)
    return {kind: str(root / kind) for kind in FAMILIES}


@pytest.fixture
def seen(monkeypatch) -> dict[str, list[tuple[torch.dtype, ...]]]:
    """The dtypes of (q, k, v) at every attention call of a packed or decoding context, and of
    (cache keys, cache values, written keys, written values) at every KV-cache write."""
    calls: dict[str, list[tuple[torch.dtype, ...]]] = {"attend": [], "decode": [], "cache": []}

    def recording(cls, name: str):
        attend = cls.attend

        def record(self, layer, q, k, v, *args, **kwargs):
            calls[name].append((q.dtype, k.dtype, v.dtype))
            return attend(self, layer, q, k, v, *args, **kwargs)

        monkeypatch.setattr(cls, "attend", record)

    recording(kv_cache.PackedContext, "attend")
    recording(kv_cache.DecodeContext, "decode")
    write = kv_cache.KVCache.write

    def record_write(self, layer, slots, k, v):
        calls["cache"].append((self.k[layer].dtype, self.v[layer].dtype, k.dtype, v.dtype))
        return write(self, layer, slots, k, v)

    monkeypatch.setattr(kv_cache.KVCache, "write", record_write)
    return calls


def only(calls: list[tuple[torch.dtype, ...]]) -> set[torch.dtype]:
    return {dtype for call in calls for dtype in call}


def assert_one_dtype_per_call(seen: dict[str, list[tuple[torch.dtype, ...]]]) -> None:
    """No attention call mixed dtypes; generation (the bf16 engine's alone) attended and wrote
    its cache in bf16. The fp32 reference's forwards attend in fp32."""
    assert seen["attend"] and seen["decode"] and seen["cache"]
    for name, calls in seen.items():
        assert all(len(set(call)) == 1 for call in calls), (name, sorted(set(calls), key=str))
    assert only(seen["decode"]) == only(seen["cache"]) == {torch.bfloat16}
    assert torch.bfloat16 in only(seen["attend"])


def batch(lengths: list[int], key: str, seed: int = 0) -> SequenceSample:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, 97, (sum(lengths),), generator=g)
    return SequenceSample.from_default(ids=list(range(len(lengths))), seqlens=lengths, data={key: ids})


def cu_seqlens(lengths: list[int]) -> torch.Tensor:
    return torch.nn.functional.pad(torch.tensor(lengths).cumsum(0), (1, 0)).int()


def nll(logits: torch.Tensor, mb: SequenceSample) -> tuple[torch.Tensor, dict[str, float]]:
    ids = mb.data["packed_input_ids"]
    return -gather_packed_shifted_log_probs(logits, mb.cu_seqlens("packed_input_ids"), ids).mean(), {}


def n_tokens(mb: SequenceSample) -> float:
    return float(sum(mb.flat_seqlens("packed_input_ids")))


def assert_close(low: torch.Tensor, ref: torch.Tensor) -> None:
    assert low.dtype == torch.bfloat16 and torch.isfinite(low).all()
    assert (low.float() - ref).abs().max() < REL_TOLERANCE * ref.abs().max()


def assert_generation_close(engine, ref: ReaLModel, decoding: str) -> None:
    """Greedy answers in bf16 whose log-probs the fp32 model reproduces within bf16 rounding."""
    g = GenerationHyperparameters(n=2, max_new_tokens=6, greedy=True, decoding=decoding)
    out = engine.generate(batch(PROMPTS, "packed_prompts", seed=3), None, TOKENIZER, g)
    assert out.prompt_lens == [p for p in PROMPTS for _ in range(2)]
    with torch.no_grad():
        logits = ref(out.sequences, cu_seqlens(out.seqlens))
    want = gather_packed_shifted_log_probs(logits, cu_seqlens(out.seqlens), out.sequences)
    answer = torch.cat([torch.arange(1, n) >= p for n, p in zip(out.seqlens, out.prompt_lens)])
    assert torch.isfinite(out.logprobs).all()
    assert (out.logprobs[answer] - want[answer]).abs().max() < LOGP_TOLERANCE


@pytest.mark.parametrize("kind", FAMILIES)
def test_train_engine_bf16_autocast_trains_infers_and_generates(kind, checkpoints, seen):
    """The train engine's mixed precision: fp32 weights and optimizer, bf16 compute."""
    torch.manual_seed(0)
    opt = OptimizerConfig(lr=1e-3, grad_clip=0.0)
    ref = TrainEngine(ReaLModel.from_pretrained(checkpoints[kind]), opt, EngineConfig(dtype="fp32"))
    low = TrainEngine(ReaLModel.from_pretrained(checkpoints[kind]), opt, EngineConfig(dtype="bf16"))
    assert low.dtype == torch.bfloat16 and {p.dtype for p in low.module.parameters()} == {torch.float32}
    data = batch(LENGTHS, "packed_input_ids")

    assert_close(low.forward(data), ref.forward(data))
    for decoding in ("eager", "static"):
        assert_generation_close(low, ref.module, decoding)

    ref_stats = ref.accumulate_gradients(data, MicroBatchSpec(n_mbs=2), nll, n_tokens)
    stats = low.accumulate_gradients(data, MicroBatchSpec(n_mbs=2), nll, n_tokens)
    assert abs(stats["loss"] - ref_stats["loss"]) < 0.02 * ref_stats["loss"]
    grads = [(p.grad, q.grad) for p, q in zip(low.module.parameters(), ref.module.parameters())]
    assert all(g.dtype == torch.float32 and torch.isfinite(g).all() for g, _ in grads)
    cosine = torch.nn.functional.cosine_similarity(
        torch.cat([g.flatten() for g, _ in grads]), torch.cat([r.flatten() for _, r in grads]), dim=0
    )
    assert cosine > 0.999
    before = [p.detach().clone() for p in low.module.parameters()]
    low.optimizer_step()
    after = list(low.module.parameters())
    assert all(p.dtype == torch.float32 and torch.isfinite(p).all() for p in after)
    assert any(not torch.equal(a, b) for a, b in zip(after, before))

    assert_one_dtype_per_call(seen)


@pytest.mark.parametrize("kind", FAMILIES)
def test_critic_head_under_bf16_autocast(kind, checkpoints, seen):
    ref = InferenceEngine(ReaLModel.from_pretrained(checkpoints[kind], is_critic=True))
    low = TrainEngine(
        ReaLModel.from_pretrained(checkpoints[kind], is_critic=True), None, EngineConfig("bf16")
    )
    low.module.load_state_dict(ref.module.state_dict())
    data = batch(LENGTHS, "packed_input_ids", seed=1)
    values = low.forward(data)
    assert values.shape == (sum(LENGTHS),)
    assert_close(values, ref.forward(data))
    assert all(len(set(call)) == 1 for call in seen["attend"]) and torch.bfloat16 in only(seen["attend"])


@pytest.mark.parametrize("kind", FAMILIES)
def test_module_cast_to_bf16_infers_and_generates(kind, checkpoints, seen):
    """The inference engine's mixed precision: the module itself in bf16, no autocast."""
    ref = ReaLModel.from_pretrained(checkpoints[kind]).eval()
    low = InferenceEngine(ReaLModel.from_pretrained(checkpoints[kind]), EngineConfig(dtype="bf16"))
    assert {p.dtype for p in low.module.parameters()} == {torch.bfloat16}
    data = batch(LENGTHS, "packed_input_ids")
    with torch.no_grad():
        assert_close(low.forward(data), ref(data.data["packed_input_ids"], cu_seqlens(LENGTHS)))
    for decoding in ("eager", "static"):
        assert_generation_close(low, ref, decoding)
    assert_one_dtype_per_call(seen)


def test_attention_refuses_queries_keys_and_values_of_mixed_dtypes():
    q = torch.randn(3, 4, 8)
    check_one_dtype(q, q, q)
    with pytest.raises(ValueError, match="one dtype.*q torch.float32, k torch.float32, v torch.bfloat16"):
        check_one_dtype(q, q, q.bfloat16())


def test_kv_cache_refuses_a_write_in_another_dtype():
    cache = kv_cache.KVCache(1, 2, 2, 4, 8, torch.bfloat16, "cpu")
    slots = cache.slots(torch.tensor([0, 1]), torch.tensor([0, 0]))
    k = torch.randn(2, 2, 8)
    cache.write(0, slots, k.bfloat16(), k.bfloat16())
    with pytest.raises(ValueError, match="KV cache holds torch.bfloat16"):
        cache.write(0, slots, k, k.bfloat16())
