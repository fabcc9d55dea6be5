"""The compute-dtype check (tests/compute_dtype.py) that bf16 end-to-end runs carry: it passes an
engine that computes in its dtype and names the op of one that does not, such as a model FSDP2
shards before it is cast (the gathered weights stay fp32, so its matmuls run in fp32)."""

from __future__ import annotations

import os
import sys

import pytest
import torch
from _backend_toy import make_batch, tiny_model
from torch.distributed.device_mesh import init_device_mesh

from realrl.impl.model.backend.config import EngineConfig, OptimizerConfig
from realrl.impl.model.backend.engine import InferenceEngine
from realrl.impl.model.backend.train_engine import TrainEngine
from realrl.impl.model.parallel.fsdp import apply_fsdp

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from compute_dtype import ComputeDtypeCheck, ComputeDtypeError  # noqa: E402

LENGTHS = [5, 9, 3]


def test_a_bf16_inference_engine_passes_and_is_counted():
    engine = InferenceEngine(tiny_model(), EngineConfig(dtype="bf16"))
    with ComputeDtypeCheck(torch.bfloat16) as check:
        engine.forward(make_batch(LENGTHS, seed=1))
    assert check.checked >= 2 * 4  # q/k/v/o and the MLP's products of two layers, at least


def test_a_bf16_train_engine_computes_under_autocast_in_bf16():
    engine = TrainEngine(tiny_model(), OptimizerConfig(lr=1e-2), EngineConfig(dtype="bf16"))
    batch = make_batch(LENGTHS, seed=2)
    with ComputeDtypeCheck(torch.bfloat16) as check, engine.mode(training=True):
        engine.packed_forward(engine.split(batch, None)[0]).float().sum().backward()
    assert check.checked > 0


def test_an_fp32_engine_fails_the_bf16_rule_naming_the_op():
    engine = InferenceEngine(tiny_model(), EngineConfig(dtype="fp32"))
    with pytest.raises(ComputeDtypeError, match=r"aten\.\w+.*torch\.float32.*bfloat16"):
        with ComputeDtypeCheck(torch.bfloat16):
            engine.forward(make_batch(LENGTHS, seed=1))


def test_a_model_sharded_before_its_cast_is_caught(one_rank_group):
    """The order FSDP2 punishes: shard, run a forward (which fixes the gathered dtype), then cast."""
    module = tiny_model()
    apply_fsdp(module, init_device_mesh("cpu", (1,)))
    batch = make_batch(LENGTHS, seed=1)
    ids = batch.data["packed_input_ids"]
    cu = torch.tensor([0, 5, 14, 17], dtype=torch.int32)
    with torch.no_grad():
        module(ids, cu)
        module.to(torch.bfloat16)
        with pytest.raises(ComputeDtypeError, match="float32"):
            with ComputeDtypeCheck(torch.bfloat16):
                module(ids, cu)


def test_an_fsdp_engine_that_casts_first_passes(one_rank_group):
    module = tiny_model()
    apply_fsdp(module, init_device_mesh("cpu", (1,)))
    engine = InferenceEngine(module, EngineConfig(dtype="bf16"))
    with ComputeDtypeCheck(torch.bfloat16) as check:
        engine.forward(make_batch(LENGTHS, seed=1))
    assert check.checked > 0


def test_an_fsdp_train_engine_settles_its_root_in_its_dtype(one_rank_group):
    """FSDP2's first forward (the engine's one-token dry run) runs under the engine's autocast,
    as every later call does: a bf16 train engine computes nothing in fp32, not even that."""
    module = tiny_model()
    apply_fsdp(module, init_device_mesh("cpu", (1,)))
    with ComputeDtypeCheck(torch.bfloat16) as check:
        engine = TrainEngine(module, OptimizerConfig(lr=1e-2), EngineConfig(dtype="bf16"))
    assert check.checked > 0 and {p.dtype for p in engine.module.parameters()} == {torch.float32}
