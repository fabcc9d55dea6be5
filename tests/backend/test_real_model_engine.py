"""The engines on ReaLModel (llama family, 2 layers, hidden 32): micro-batch invariance, dropout
off, HF-format checkpoints that transformers loads, exact resume, generation, backends."""

from __future__ import annotations

import os

import pytest
import torch
import transformers
from _backend_toy import make_batch, n_loss_tokens, tiny_config, token_loss

import realrl.impl.builtin  # noqa: F401  (registers models and backends)
from realrl.api.core.config import ModelAbstraction
from realrl.api.core.data_api import MicroBatchSpec, SequenceSample
from realrl.api.core.model_api import (
    FinetuneSpec,
    GenerationHyperparameters,
    make_backend,
    make_model,
)
from realrl.impl.model.backend.config import EngineConfig, OptimizerConfig
from realrl.impl.model.backend.engine import InferenceEngine
from realrl.impl.model.backend.train_engine import TrainEngine
from realrl.impl.model.nn import ReaLModel

LENGTHS = [5, 9, 3, 12, 7, 4, 10, 6]


def train_engine(seed: int = 0, engine_cfg: EngineConfig | None = None, **kw) -> TrainEngine:
    torch.manual_seed(seed)
    opt = OptimizerConfig(lr=1e-2, weight_decay=0.1, lr_scheduler_type="linear")
    return TrainEngine(ReaLModel(tiny_config(**kw)), opt, engine_cfg, total_train_steps=4)


def grads(engine: TrainEngine) -> list[torch.Tensor]:
    return [p.grad.clone() for p in engine.module.parameters()]


def test_gradient_same_for_1_or_8_micro_batches():
    batch = make_batch(LENGTHS, n_seqs_per_sample=2)
    one, eight = train_engine(), train_engine()
    one.accumulate_gradients(batch, MicroBatchSpec(), token_loss, n_loss_tokens)
    stats = eight.accumulate_gradients(batch, MicroBatchSpec(n_mbs=8), token_loss, n_loss_tokens)
    assert stats["n_mbs"] == 8
    for a, b in zip(grads(one), grads(eight)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_dropout_off_makes_train_and_eval_forward_agree():
    batch = make_batch(LENGTHS)
    ids, cu = batch.data["packed_input_ids"], batch.cu_seqlens("packed_input_ids")
    pdrop = dict(embd_pdrop=0.3, attn_pdrop=0.3, resid_pdrop=0.3)
    for disable, same in [(True, True), (False, False)]:
        engine = train_engine(engine_cfg=EngineConfig(disable_dropout=disable), **pdrop)
        engine.train()
        train_out = engine.module(ids, cu)
        engine.eval()
        assert torch.equal(train_out, engine.module(ids, cu)) == same


def step(engine: TrainEngine, i: int) -> None:
    batch = make_batch(LENGTHS, seed=100 + i)
    engine.train_batch(batch, MicroBatchSpec(n_mbs=2), token_loss, n_loss_tokens, version_steps=i)


def test_checkpoint_is_hf_format_and_resume_is_exact(tmp_path):
    straight = train_engine()
    for i in range(4):
        step(straight, i)

    first = train_engine()
    for i in range(2):
        step(first, i)
    path = str(tmp_path / "ckpt")
    first.save(path, extra_state={"dataset_position": 16})
    assert {"config.json", "model.safetensors", "engine_state.pt"} <= set(os.listdir(path))

    # transformers reads the checkpoint and computes the same logits
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    ids = make_batch([7]).data["packed_input_ids"]
    with torch.no_grad():
        want = first.module(ids, torch.tensor([0, 7], dtype=torch.int32))
        got = hf(input_ids=ids[None]).logits[0]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)

    resumed = train_engine(seed=5)
    assert resumed.load(path) == {"dataset_position": 16}
    for i in range(2, 4):
        step(resumed, i)
    for a, b in zip(straight.module.parameters(), resumed.module.parameters()):
        assert torch.equal(a, b)


def test_gradient_checkpointing_wraps_layers_same_gradient_same_names(tmp_path):
    batch = make_batch(LENGTHS)
    plain = train_engine()
    ckpt = train_engine(engine_cfg=EngineConfig(gradient_checkpointing=True))
    assert list(ckpt.module.state_dict()) == list(plain.module.state_dict())
    inner = ckpt.module.layers[0]._checkpoint_wrapped_module  # the original block, now wrapped
    calls = []
    inner.register_forward_hook(lambda *a: calls.append(1))
    with torch.utils.checkpoint.set_checkpoint_early_stop(False):  # recompute whole blocks
        for e in (plain, ckpt):
            e.accumulate_gradients(batch, MicroBatchSpec(n_mbs=2), token_loss, n_loss_tokens)
    assert len(calls) == 4  # 2 micro-batches, each block forward recomputed once in backward
    for a, b in zip(grads(plain), grads(ckpt)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    ckpt.optimizer_step(0)
    ckpt.save(str(tmp_path / "c"))  # HF names: loadable by a plain engine
    other = train_engine(seed=2)
    other.load(str(tmp_path / "c"))
    for a, b in zip(ckpt.module.state_dict().values(), other.module.state_dict().values()):
        assert torch.equal(a, b)


def test_critic_checkpoint_round_trip(tmp_path):
    engine = train_engine(is_critic=True)
    batch = make_batch(LENGTHS)
    values = engine.forward(batch, MicroBatchSpec(n_mbs=3))
    assert values.shape == (sum(LENGTHS),)

    def value_loss(v, mb):
        return (v**2).mean(), {}

    engine.train_batch(batch, None, value_loss, lambda mb: float(sum(mb.flat_seqlens("packed_input_ids"))))
    engine.save(str(tmp_path / "critic"))
    other = train_engine(seed=3, is_critic=True)
    other.load(str(tmp_path / "critic"))
    for a, b in zip(engine.module.parameters(), other.module.parameters()):
        assert torch.equal(a, b)


def test_generate_micro_batches_are_prompt_major():
    torch.manual_seed(0)
    engine = InferenceEngine(ReaLModel(tiny_config()))
    plens = [3, 6, 2, 5]
    g = torch.Generator().manual_seed(0)
    prompts = SequenceSample.from_default(
        ids=list("abcd"),
        seqlens=plens,
        data={"packed_prompts": torch.randint(0, 17, (sum(plens),), generator=g)},
    )
    gconfig = GenerationHyperparameters(n=2, max_new_tokens=5, greedy=True)
    one = engine.generate(prompts, None, None, gconfig)
    many = engine.generate(prompts, MicroBatchSpec(n_mbs=4), None, gconfig)
    assert one.prompt_lens == many.prompt_lens == [3, 3, 6, 6, 2, 2, 5, 5]
    assert one.seqlens == many.seqlens
    assert torch.equal(one.sequences, many.sequences)
    torch.testing.assert_close(one.logprobs, many.logprobs, rtol=1e-4, atol=1e-5)


def test_backends_from_registries():
    cfg = {k: v for k, v in tiny_config().__dict__.items() if k != "is_critic"}
    ft = FinetuneSpec(total_train_epochs=1, dataset_size=8, train_batch_size=2)
    model = make_model(ModelAbstraction("real_model", {"config": cfg}), "actor")
    model = make_backend("train").initialize(model, ft)
    assert isinstance(model.module, TrainEngine) and model.module.lr_scheduler.total_steps == 4
    stats = model.module.train_batch(make_batch(LENGTHS), MicroBatchSpec(n_mbs=2), token_loss, n_loss_tokens)
    assert stats["loss"] > 0
    ref = make_backend("inference").initialize(
        make_model(ModelAbstraction("real_model", {"config": cfg}), "ref"), ft
    )
    assert isinstance(ref.module, InferenceEngine)
    assert ref.module.forward(make_batch(LENGTHS)).shape == (sum(LENGTHS), 17)


@pytest.mark.gpu
def test_bf16_training_on_gpu():
    torch.manual_seed(0)
    engine = TrainEngine(ReaLModel(tiny_config()), OptimizerConfig(lr=1e-3), EngineConfig(), device="cuda")
    assert engine.dtype == torch.bfloat16
    batch = make_batch(LENGTHS)
    losses = [
        engine.train_batch(batch, MicroBatchSpec(n_mbs=2), token_loss, n_loss_tokens)["loss"]
        for _ in range(5)
    ]
    assert all(p.dtype == torch.float32 for p in engine.module.parameters())
    assert losses[-1] < losses[0]
