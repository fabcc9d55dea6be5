"""Engines on FSDP2-sharded models compute in their configured dtype (bf16 here): FSDP2 fixes the
dtype it gathers weights in at its first forward, so the engine casts before that forward.

One rank in-process (a gloo group over an in-memory store): FSDP2's dtype handling is the same
whatever the number of ranks."""

from __future__ import annotations

import torch
from _backend_toy import make_batch, n_loss_tokens, tiny_model, token_loss
from torch.distributed.device_mesh import init_device_mesh

from realrl.impl.model.backend.config import EngineConfig, OptimizerConfig
from realrl.impl.model.backend.engine import InferenceEngine
from realrl.impl.model.backend.train_engine import TrainEngine
from realrl.impl.model.parallel.dtensor import is_dtensor
from realrl.impl.model.parallel.fsdp import apply_fsdp, gathered
from realrl.impl.model.parallel.pipeline import PipelineStage

BF16 = EngineConfig(dtype="bf16")
LENGTHS = [5, 9, 3]


def sharded(module: torch.nn.Module) -> torch.nn.Module:
    apply_fsdp(module, init_device_mesh("cpu", (1,)))
    return module


def gathered_dtypes(module: torch.nn.Module) -> set[torch.dtype]:
    with gathered(module):
        return {p.dtype for p in module.parameters()}


def test_fsdp_inference_engine_gathers_and_computes_in_bf16(one_rank_group):
    batch = make_batch(LENGTHS, seed=1)
    want = InferenceEngine(tiny_model(), BF16).forward(batch)
    engine = InferenceEngine(sharded(tiny_model()), BF16)
    assert all(is_dtensor(p) for p in engine.module.parameters())  # sharded again after its first forward
    got = engine.forward(batch)
    assert got.dtype == torch.bfloat16
    assert gathered_dtypes(engine.module) == {torch.bfloat16}  # the weights FSDP2 gathers
    torch.testing.assert_close(got, want)  # what the unsharded bf16 engine computes


def test_fsdp_pipeline_stage_hands_on_its_own_dtype(one_rank_group):
    """The activations a first stage hands the next are in the stage's dtype, the dtype its link
    to the next stage carries."""
    stage = PipelineStage.of(tiny_model(), 0, 2)
    engine = InferenceEngine(sharded(stage), BF16)
    ids = make_batch(LENGTHS, seed=2).data["packed_input_ids"]
    cu = torch.tensor([0, 5, 14, 17], dtype=torch.int32)
    with torch.no_grad():
        hidden = engine.module(ids, cu)
    assert stage.dtype == torch.bfloat16 and hidden.dtype == torch.bfloat16


def test_fsdp_train_engine_keeps_fp32_masters_and_computes_in_bf16(one_rank_group):
    engine = TrainEngine(sharded(tiny_model()), OptimizerConfig(lr=1e-2), BF16)
    assert {p.dtype for p in engine.module.parameters()} == {torch.float32}
    batch = make_batch(LENGTHS, seed=3)
    with engine.mode(training=True):
        out = engine.packed_forward(engine.split(batch, None)[0])
    assert out.dtype == torch.bfloat16
    stats = engine.train_batch(batch, None, token_loss, n_loss_tokens)
    assert torch.isfinite(torch.tensor(stats["loss"]))
    assert {p.dtype for p in engine.module.parameters()} == {torch.float32}
