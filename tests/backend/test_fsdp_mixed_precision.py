"""A bf16/fp16 FSDP2 train engine gathers each unit's weights in its dtype (FSDP2's
``MixedPrecisionPolicy``), not in fp32: its shards stay fp32 master weights and its gradients
reach them in fp32, so the optimizer and the fp16 loss scaler see what they saw before.

One rank in-process (a gloo group over an in-memory store): FSDP2's dtype handling is the same
whatever the number of ranks."""

from __future__ import annotations

import os
import sys

import pytest
import torch
from _backend_toy import make_batch, n_loss_tokens, tiny_model, token_loss
from torch.distributed.device_mesh import init_device_mesh

from realrl.impl.model.backend.backends import fsdp_param_dtype
from realrl.impl.model.backend.config import EngineConfig, OptimizerConfig
from realrl.impl.model.backend.train_engine import TrainEngine
from realrl.impl.model.parallel.dtensor import is_dtensor
from realrl.impl.model.parallel.fsdp import apply_fsdp, gathered

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from compute_dtype import ComputeDtypeCheck  # noqa: E402

LENGTHS = [5, 9, 3]


def fsdp_train_engine(dtype: str) -> TrainEngine:
    """Sharded as the train backend shards it: the policy's dtype is the backend's decision."""
    config = EngineConfig(dtype=dtype, fsdp=True)
    module = tiny_model()
    apply_fsdp(module, init_device_mesh("cpu", (1,)), fsdp_param_dtype(config, "cpu", trains=True))
    return TrainEngine(module, OptimizerConfig(lr=1e-2), config)


def gathered_dtypes(module: torch.nn.Module) -> set[torch.dtype]:
    with gathered(module):
        return {p.dtype for p in module.parameters()}


def test_only_a_low_precision_fsdp_train_engine_gets_a_gather_dtype():
    assert fsdp_param_dtype(EngineConfig(dtype="bf16", fsdp=True), "cpu", trains=True) == torch.bfloat16
    assert fsdp_param_dtype(EngineConfig(dtype="fp16", fsdp=True), "cpu", trains=True) == torch.float16
    assert fsdp_param_dtype(EngineConfig(dtype="bf16", fsdp=True), "cpu", trains=False) is None
    assert fsdp_param_dtype(EngineConfig(dtype="fp32", fsdp=True), "cpu", trains=True) is None
    assert fsdp_param_dtype(EngineConfig(dtype="auto", fsdp=True), "cpu", trains=True) is None  # fp32 on CPU
    assert fsdp_param_dtype(EngineConfig(dtype="bf16"), "cpu", trains=True) is None  # no FSDP


def test_bf16_fsdp_train_engine_gathers_in_bf16_over_fp32_masters(one_rank_group):
    engine = fsdp_train_engine("bf16")
    params = list(engine.module.parameters())
    assert all(is_dtensor(p) for p in params) and {p.dtype for p in params} == {torch.float32}
    assert gathered_dtypes(engine.module) == {torch.bfloat16}
    before = [p.detach().full_tensor().clone() for p in params]

    batch = make_batch(LENGTHS, seed=3)
    stats = engine.accumulate_gradients(batch, None, token_loss, n_loss_tokens)
    assert all(p.grad is not None and is_dtensor(p.grad) for p in params)
    assert {p.grad.dtype for p in params} == {torch.float32}  # reduce-scattered in fp32
    engine.optimizer_step()
    assert {p.dtype for p in engine.module.parameters()} == {torch.float32}
    assert any(not torch.equal(b, p.detach().full_tensor()) for b, p in zip(before, params))

    reference = TrainEngine(tiny_model(), OptimizerConfig(lr=1e-2), EngineConfig(dtype="bf16"))
    want = reference.train_batch(batch, None, token_loss, n_loss_tokens)
    assert stats["loss"] == pytest.approx(want["loss"], rel=2e-2)  # bf16 weights vs autocast's casts


def test_bf16_fsdp_train_engine_keeps_the_compute_dtype_rule(one_rank_group):
    with ComputeDtypeCheck(torch.bfloat16) as check:
        engine = fsdp_train_engine("bf16")
        stats = engine.train_batch(make_batch(LENGTHS, seed=4), None, token_loss, n_loss_tokens)
    assert check.checked > 0 and torch.isfinite(torch.tensor(stats["loss"]))
    assert stats["update_skipped"] == 0.0


def test_fp16_fsdp_train_engine_scales_its_loss_over_fp32_gradients(one_rank_group):
    engine = fsdp_train_engine("fp16")
    assert engine.loss_scaler is not None and gathered_dtypes(engine.module) == {torch.float16}
    scale = engine.loss_scaler.get_scale()
    batch = make_batch(LENGTHS, seed=5)
    engine.accumulate_gradients(batch, None, token_loss, n_loss_tokens)
    grads = [p.grad for p in engine.module.parameters()]
    assert {g.dtype for g in grads} == {torch.float32}
    scaled_norm = torch.sqrt(sum(g.full_tensor().float().pow(2).sum() for g in grads))
    stats = engine.optimizer_step()
    assert stats["update_skipped"] == 0.0 and stats["grad_norm"] > 0
    assert float(scaled_norm) == pytest.approx(stats["grad_norm"] * scale, rel=1e-3)  # unscaled once
    assert {p.dtype for p in engine.module.parameters()} == {torch.float32}
