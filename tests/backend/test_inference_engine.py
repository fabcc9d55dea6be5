"""Inference engine: micro-batched forward in sample order, post hooks, generation, modes."""

from __future__ import annotations

import pytest
import torch
from _backend_toy import PackedToyLM, make_batch

from realrl.api.core.data_api import MicroBatchSpec, SequenceSample
from realrl.api.core.model_api import GenerationHyperparameters
from realrl.impl.model.backend.config import EngineConfig, OptimizerConfig
from realrl.impl.model.backend.engine import InferenceEngine
from realrl.impl.model.backend.train_engine import TrainEngine

LENGTHS = [5, 9, 3, 12, 7, 4]


def make_engine(pdrop: float = 0.0, critic: bool = False, **cfg) -> InferenceEngine:
    torch.manual_seed(0)
    return InferenceEngine(PackedToyLM(pdrop=pdrop, critic=critic), EngineConfig(**cfg))


def per_sample_outputs(engine: InferenceEngine, batch: SequenceSample) -> torch.Tensor:
    with torch.no_grad():
        outs = [
            engine.module(s.data["packed_input_ids"], s.cu_seqlens("packed_input_ids"))
            for s in batch.unpack()
        ]
    return torch.cat(outs)


@pytest.mark.parametrize("critic", [False, True])
@pytest.mark.parametrize("mb_spec", [None, MicroBatchSpec(n_mbs=3), MicroBatchSpec(max_tokens_per_mb=10)])
def test_forward_concatenates_in_sample_order(mb_spec, critic):
    batch = make_batch(LENGTHS, n_seqs_per_sample=2)
    engine = make_engine(critic=critic)
    out = engine.forward(batch, mb_spec)
    want = per_sample_outputs(engine, batch)
    assert out.shape == want.shape == ((sum(LENGTHS) * 2,) if critic else (sum(LENGTHS) * 2, 17))
    torch.testing.assert_close(out, want)
    assert not out.requires_grad


def test_post_hook_sees_each_micro_batch_and_custom_aggregate():
    batch = make_batch(LENGTHS)
    engine = make_engine()
    seen = []

    def hook(logits, mb):
        seen.append(list(mb.ids))
        return logits.shape[0]

    out = engine.forward(batch, MicroBatchSpec(n_mbs=3), post_hook=hook, aggregate_fn=list)
    assert [i for ids in seen for i in ids] == batch.ids and len(seen) == 3
    assert sum(out) == sum(LENGTHS)


def test_forward_runs_in_eval_mode_and_restores_mode():
    batch = make_batch(LENGTHS)
    engine = make_engine(pdrop=0.5, disable_dropout=False)
    engine.train()
    a = engine.forward(batch)
    b = engine.forward(batch)
    assert torch.equal(a, b)  # dropout was off during forward: deterministic
    assert engine.module.training


def test_generate_prompt_major_across_micro_batches():
    g = torch.Generator().manual_seed(1)
    plens = [3, 5, 2, 4]
    prompts = SequenceSample.from_default(
        ids=["a", "b", "c", "d"],
        seqlens=plens,
        data={"packed_prompts": torch.randint(0, 17, (sum(plens),), generator=g)},
    )
    engine = make_engine()
    gconfig = GenerationHyperparameters(n=2, max_new_tokens=4, greedy=True)
    one = engine.generate(prompts, None, tokenizer=None, gconfig=gconfig)
    many = engine.generate(prompts, MicroBatchSpec(n_mbs=3), tokenizer=None, gconfig=gconfig)
    assert one.prompt_lens == [3, 3, 5, 5, 2, 2, 4, 4] == many.prompt_lens
    assert one.seqlens == many.seqlens == [p + 4 for p in one.prompt_lens]
    assert torch.equal(one.sequences, many.sequences)
    torch.testing.assert_close(one.logprobs, many.logprobs)
    assert one.logprobs.shape[0] == sum(one.seqlens) - len(one.seqlens)
    # each sequence starts with its prompt
    off, poff = 0, 0
    for p in plens:
        for _ in range(2):
            assert torch.equal(one.sequences[off : off + p], prompts.data["packed_prompts"][poff : poff + p])
            off += p + 4
        poff += p


def test_generate_passes_tokenizer_eos():
    class Tok:
        eos_token_id = 5

    seen = {}

    class Spy(PackedToyLM):
        def generate(self, input_ids, cu_seqlens, gconfig, eos_token_id=None):
            seen["eos"] = eos_token_id
            return super().generate(input_ids, cu_seqlens, gconfig, eos_token_id)

    prompts = SequenceSample.from_default(
        ids=[0], seqlens=[3], data={"packed_prompts": torch.tensor([1, 2, 3])}
    )
    InferenceEngine(Spy()).generate(prompts, None, Tok(), GenerationHyperparameters(max_new_tokens=2))
    assert seen["eos"] == 5


def test_generate_passes_prompt_keys_only_to_modules_that_name_them():
    """A module naming ``prompt_keys`` in ``generate_options`` gets one int64 key per prompt, the
    same for a sample in any micro-batch; greedy calls and other modules get none."""
    seen: list = []

    class Keyed(PackedToyLM):
        generate_options = ("prompt_keys",)

        def generate(self, input_ids, cu_seqlens, gconfig, eos_token_id=None, prompt_keys=None):
            seen.append(prompt_keys)
            return super().generate(input_ids, cu_seqlens, gconfig, eos_token_id)

    plens = [[3], [2, 4], [5]]  # the second sample holds two prompts
    prompts = SequenceSample.from_default(
        ids=[10, 11, 12], seqlens=plens, data={"packed_prompts": torch.arange(14) % 17}
    )
    engine = InferenceEngine(Keyed())
    sampled = GenerationHyperparameters(max_new_tokens=1)
    torch.manual_seed(0)
    engine.generate(prompts, None, None, sampled)
    torch.manual_seed(0)
    engine.generate(prompts, MicroBatchSpec(n_mbs=3), None, sampled)
    whole, pieces = seen[0], torch.cat(seen[1:])
    assert whole.dtype == torch.long and whole.shape == (4,) and len(torch.unique(whole)) == 4
    assert torch.equal(whole, pieces) and len(seen) == 4
    seen.clear()
    engine.generate(prompts, None, None, GenerationHyperparameters(max_new_tokens=1, greedy=True))
    assert seen == [None]


def test_train_engine_also_serves_forward():
    batch = make_batch(LENGTHS)
    torch.manual_seed(0)
    train = TrainEngine(PackedToyLM(), OptimizerConfig())
    torch.testing.assert_close(train.forward(batch, MicroBatchSpec(n_mbs=2)), make_engine().forward(batch))


def test_inference_engine_casts_to_configured_dtype():
    engine = make_engine(dtype="bf16")
    assert all(p.dtype == torch.bfloat16 for p in engine.module.parameters())
    assert engine.forward(make_batch(LENGTHS)).dtype == torch.bfloat16
    assert make_engine().dtype == torch.float32  # auto on CPU


def test_missing_keys_are_named():
    engine = make_engine()
    batch = make_batch(LENGTHS)
    with pytest.raises(ValueError, match="packed_prompts"):
        engine.generate(batch, None, None, GenerationHyperparameters())
    with pytest.raises(ValueError, match="metadata only"):
        engine.forward(batch.meta())
    with pytest.raises(ValueError, match="EngineConfig.dtype"):
        EngineConfig(dtype="fp8")


def _devices_seen(engine: InferenceEngine) -> list[torch.device]:
    """The device of the module's weights at each forward (a hook records it)."""
    seen: list[torch.device] = []
    engine.module.register_forward_pre_hook(lambda m, args: seen.append(next(m.parameters()).device))
    return seen


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)], ids=["cpu", "cuda"])
def test_an_offloaded_model_visits_the_device_for_each_call_only(device):
    batch = make_batch(LENGTHS)
    torch.manual_seed(0)
    kept = InferenceEngine(PackedToyLM(), EngineConfig(dtype="fp32"), device=device)
    torch.manual_seed(0)
    offloaded = InferenceEngine(PackedToyLM(), EngineConfig(dtype="fp32"), device=device, offload=True)
    seen = _devices_seen(offloaded)
    assert next(offloaded.module.parameters()).device.type == "cpu"  # host memory between calls
    torch.testing.assert_close(offloaded.forward(batch).cpu(), kept.forward(batch).cpu())
    assert [d.type for d in seen] == [device]  # on the device during the call
    assert next(offloaded.module.parameters()).device.type == "cpu"
