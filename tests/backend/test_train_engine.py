"""Train engine: gradients independent of micro-batching, clipping, dropout, modes, errors."""

from __future__ import annotations

import pytest
import torch
from _backend_toy import PackedToyLM, loss_mask, make_batch, n_loss_tokens, token_loss

from realrl.api.core.data_api import MicroBatchSpec
from realrl.impl.model.backend.config import EngineConfig, OptimizerConfig
from realrl.impl.model.backend.lr_schedule import LRScheduler
from realrl.impl.model.backend.train_engine import TrainEngine
from realrl.impl.model.utils.functional import gather_packed_shifted_log_probs

LENGTHS = [5, 9, 3, 12, 7, 4, 10, 6, 8, 11]


def make_engine(
    seed: int = 0, pdrop: float = 0.0, engine_cfg: EngineConfig | None = None, **opt
) -> TrainEngine:
    torch.manual_seed(seed)
    return TrainEngine(PackedToyLM(pdrop=pdrop), OptimizerConfig(**opt), engine_cfg, total_train_steps=10)


def grads(engine: TrainEngine) -> list[torch.Tensor]:
    return [p.grad.clone() for p in engine.module.parameters()]


def reference_grads(seed: int, batch) -> list[torch.Tensor]:
    """The batch-mean token loss back-propagated in one plain forward, no engine."""
    torch.manual_seed(seed)
    model = PackedToyLM()
    logits = model(batch.data["packed_input_ids"], batch.cu_seqlens("packed_input_ids"))
    token_loss(logits, batch)[0].backward()
    return [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize(
    "mb_spec", [MicroBatchSpec(), MicroBatchSpec(n_mbs=8), MicroBatchSpec(max_tokens_per_mb=20)]
)
@pytest.mark.parametrize("n_seqs", [1, 2])
def test_gradient_independent_of_micro_batches(mb_spec, n_seqs):
    batch = make_batch(LENGTHS, n_seqs_per_sample=n_seqs)
    engine = make_engine()
    stats = engine.accumulate_gradients(batch, mb_spec, token_loss, n_loss_tokens)
    assert stats["n_mbs"] >= mb_spec.n_mbs
    for got, want in zip(grads(engine), reference_grads(0, batch)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_unweighted_micro_batch_mean_would_differ():
    """Guard that the test batch is uneven enough: averaging micro-batch means is not the answer."""
    batch = make_batch(LENGTHS)
    engine = make_engine()
    engine.accumulate_gradients(batch, MicroBatchSpec(n_mbs=8), token_loss, lambda mb: 1.0)
    diffs = [(a - b).abs().max() for a, b in zip(grads(engine), reference_grads(0, batch))]
    assert max(diffs) > 1e-4


def test_dp_scope_equals_global_in_one_process():
    batch = make_batch(LENGTHS)
    a, b = make_engine(), make_engine()
    a.accumulate_gradients(batch, MicroBatchSpec(n_mbs=4), token_loss, n_loss_tokens, "global")
    b.accumulate_gradients(batch, MicroBatchSpec(n_mbs=4), token_loss, n_loss_tokens, "dp")
    for x, y in zip(grads(a), grads(b)):
        torch.testing.assert_close(x, y)


def test_train_batch_steps_once_and_reports():
    batch = make_batch(LENGTHS)
    engine = make_engine(lr=1e-2)
    before = [p.detach().clone() for p in engine.module.parameters()]
    stats = engine.train_batch(batch, MicroBatchSpec(n_mbs=3), token_loss, n_loss_tokens, version_steps=0)
    assert stats["n_mbs"] == 3 and stats["n_tokens"] == sum(LENGTHS)
    assert stats["lr"] == pytest.approx(1e-2) and stats["grad_norm"] > 0
    assert stats["loss"] == pytest.approx(stats["nll"])
    assert stats["loss_weight"] == n_loss_tokens(batch)
    assert all(p.grad is None for p in engine.module.parameters())
    assert all(not torch.equal(a, p) for a, p in zip(before, engine.module.parameters()))
    # the loss goes down on the batch it trains on
    losses = [
        engine.train_batch(batch, None, token_loss, n_loss_tokens, version_steps=i)["loss"] for i in range(5)
    ]
    assert losses[-1] < stats["loss"]


def test_gradient_clipping_bounds_the_update():
    batch = make_batch(LENGTHS)
    engine = make_engine(grad_clip=1e-3)
    # swap in SGD so the update is exactly -lr * clipped gradient
    engine.optimizer = torch.optim.SGD(engine.module.parameters(), lr=1.0)
    engine.lr_scheduler = LRScheduler(engine.optimizer, engine.optimizer_config, 10)
    before = [p.detach().clone() for p in engine.module.parameters()]
    stats = engine.train_batch(batch, None, token_loss, n_loss_tokens)
    delta = torch.cat([(b - p.detach()).flatten() for b, p in zip(before, engine.module.parameters())])
    assert stats["grad_norm"] > 1e-2
    assert float(delta.norm()) == pytest.approx(1e-3, rel=1e-4)


def test_zero_loss_weight_gives_zero_gradient():
    batch = make_batch(LENGTHS)
    engine = make_engine()
    engine.accumulate_gradients(batch, None, token_loss, lambda mb: 0.0)
    assert all(p.grad is None or float(p.grad.abs().max()) == 0.0 for p in engine.module.parameters())


def test_dropout_disabled_by_config():
    batch = make_batch(LENGTHS)
    ids, cu = batch.data["packed_input_ids"], batch.cu_seqlens("packed_input_ids")
    off = make_engine(pdrop=0.5, engine_cfg=EngineConfig(disable_dropout=True))
    on = make_engine(pdrop=0.5, engine_cfg=EngineConfig(disable_dropout=False))
    for engine, same in [(off, True), (on, False)]:
        engine.train()
        train_out = engine.module(ids, cu)
        engine.eval()
        eval_out = engine.module(ids, cu)
        assert torch.equal(train_out, eval_out) == same


def test_train_batch_runs_in_train_mode_and_restores_mode():
    seen = []

    def loss_fn(out, mb):
        seen.append(engine.module.training)
        return token_loss(out, mb)

    engine = make_engine()
    engine.eval()
    engine.train_batch(make_batch(LENGTHS), MicroBatchSpec(n_mbs=2), loss_fn, n_loss_tokens)
    assert seen == [True, True] and not engine.module.training


def test_gradient_checkpointing_same_gradient():
    batch = make_batch(LENGTHS)
    plain = make_engine()
    ckpt = make_engine(engine_cfg=EngineConfig(gradient_checkpointing=True))
    assert ckpt.module.checkpointing
    for e in (plain, ckpt):
        e.accumulate_gradients(batch, MicroBatchSpec(n_mbs=2), token_loss, n_loss_tokens)
    for x, y in zip(grads(plain), grads(ckpt)):
        torch.testing.assert_close(x, y)


def test_gradient_checkpointing_needs_module_support():
    with pytest.raises(ValueError, match=r"gradient_checkpointing_enable\(\) nor its blocks"):
        TrainEngine(torch.nn.Linear(2, 2), engine_config=EngineConfig(gradient_checkpointing=True))


def test_bf16_autocast_keeps_fp32_master_weights():
    batch = make_batch(LENGTHS)
    engine = make_engine(engine_cfg=EngineConfig(dtype="bf16"), lr=1e-2)
    seen = []

    def loss_fn(out, mb):
        seen.append(out.dtype)
        return token_loss(out.float(), mb)

    stats = engine.train_batch(batch, None, loss_fn, n_loss_tokens)
    assert seen == [torch.bfloat16]
    assert all(p.dtype == torch.float32 for p in engine.module.parameters())
    assert torch.isfinite(torch.tensor(stats["loss"]))


def test_bad_scope_and_missing_key_raise():
    engine = make_engine()
    batch = make_batch(LENGTHS)
    with pytest.raises(ValueError, match="token_normalize_scope"):
        engine.train_batch(batch, None, token_loss, n_loss_tokens, token_normalize_scope="tokens")
    with pytest.raises(ValueError, match="packed_input_ids"):
        engine.train_batch(batch.select(["prompt_mask"]), None, token_loss, n_loss_tokens)


def test_non_finite_gradient_skips_the_update():
    engine = make_engine()
    before = [p.detach().clone() for p in engine.module.parameters()]

    def nan_loss(out, mb):
        return out.sum() * float("nan"), {}

    stats = engine.train_batch(make_batch(LENGTHS), None, nan_loss, n_loss_tokens)
    assert stats["update_skipped"] == 1.0
    assert all(torch.equal(a, p) for a, p in zip(before, engine.module.parameters()))


def test_lr_follows_version_steps_or_counts_updates():
    batch = make_batch(LENGTHS)
    engine = make_engine(lr=1.0, lr_scheduler_type="linear")  # 10 total steps
    lrs = [
        engine.train_batch(batch, None, token_loss, n_loss_tokens, version_steps=4)["lr"] for _ in range(2)
    ]
    assert lrs == [pytest.approx(0.6), pytest.approx(0.6)]  # two updates of one version share its LR
    fresh = make_engine(lr=1.0, lr_scheduler_type="linear")
    lrs = [fresh.train_batch(batch, None, token_loss, n_loss_tokens)["lr"] for _ in range(3)]
    assert lrs == [pytest.approx(1.0), pytest.approx(0.9), pytest.approx(0.8)]


def test_micro_batch_without_loss_tokens_is_skipped():
    """A micro-batch whose mean loss is 0/0 must not poison the gradient with NaN."""
    batch = make_batch(LENGTHS)
    n_first = batch.split(MicroBatchSpec(n_mbs=2))[0].bs  # make the first micro-batch all prompt
    batch.data["prompt_mask"][: batch.sample_offsets("packed_input_ids")[n_first]] = True

    def unguarded_mean(logits, mb):
        ids, cu = mb.data["packed_input_ids"], mb.cu_seqlens("packed_input_ids")
        mask = loss_mask(mb)
        return -(gather_packed_shifted_log_probs(logits, cu, ids) * mask).sum() / mask.sum(), {}

    engine = make_engine()
    assert [n_loss_tokens(mb) == 0 for mb in batch.split(MicroBatchSpec(n_mbs=2))] == [True, False]
    engine.accumulate_gradients(batch, MicroBatchSpec(n_mbs=2), unguarded_mean, n_loss_tokens)
    for got, want in zip(grads(engine), reference_grads(0, batch)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_fp16_uses_a_loss_scaler_and_skips_overflowing_steps():
    batch = make_batch(LENGTHS)
    engine = make_engine(engine_cfg=EngineConfig(dtype="fp16"), lr=1e-2)
    assert engine.loss_scaler is not None
    scale = engine.loss_scaler.get_scale()
    stats = engine.train_batch(batch, None, lambda out, mb: token_loss(out.float(), mb), n_loss_tokens)
    assert stats["update_skipped"] == 0.0 and engine.loss_scaler.get_scale() == scale
    assert all(p.dtype == torch.float32 for p in engine.module.parameters())
    before = [p.detach().clone() for p in engine.module.parameters()]

    def inf_loss(out, mb):
        return out.float().sum() * float("inf"), {}

    stats = engine.train_batch(batch, None, inf_loss, n_loss_tokens)
    assert stats["update_skipped"] == 1.0 and engine.loss_scaler.get_scale() < scale
    assert all(torch.equal(a, p) for a, p in zip(before, engine.module.parameters()))


def test_statistics_are_weighted_means_but_maxima_stay_maxima():
    batch = make_batch(LENGTHS)
    engine = make_engine()

    def loss_fn(out, mb):
        loss, _ = token_loss(out, mb)
        longest = float(max(mb.flat_seqlens("packed_input_ids")))
        return loss, {"longest": longest, "longest_max": longest}

    stats = engine.accumulate_gradients(batch, MicroBatchSpec(n_mbs=4), loss_fn, n_loss_tokens)
    assert stats["n_mbs"] == 4
    assert stats["longest_max"] == max(LENGTHS)  # the largest over the micro-batches
    assert stats["longest"] < max(LENGTHS)  # a weighted mean
