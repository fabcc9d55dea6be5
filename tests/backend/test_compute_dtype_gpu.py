"""The compute-dtype check (tests/compute_dtype.py) on a GPU: a tiny ReaLModel sharded by FSDP2
over a one-rank NCCL group, in a bf16 inference engine and a bf16 train engine on CUDA, computes
every matmul and attention in bf16 (forward, and a whole train step: backward and optimizer).

The CPU version (test_compute_dtype_check.py, gloo) cannot show what CUDA adds: NCCL's
all-gathers of the shards, the CUDA attention kernels and autocast on CUDA. Skipped without a
CUDA device (the ``gpu`` mark, tests/conftest.py) or without NCCL.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch
import torch.distributed as dist
from _backend_toy import make_batch, n_loss_tokens, tiny_model, token_loss
from torch.distributed.device_mesh import init_device_mesh

from realrl.impl.model.backend.config import EngineConfig, OptimizerConfig
from realrl.impl.model.backend.engine import InferenceEngine
from realrl.impl.model.backend.train_engine import TrainEngine
from realrl.impl.model.nn import ReaLModel
from realrl.impl.model.parallel.fsdp import apply_fsdp

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from compute_dtype import ComputeDtypeCheck  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not dist.is_nccl_available(), reason="this torch has no NCCL"),
]

LENGTHS = [5, 9, 3]  # the CPU version's shapes


def sharded_model() -> ReaLModel:
    """The CPU version's tiny model, on the GPU, sharded over the one-rank CUDA mesh."""
    module = tiny_model().cuda()
    apply_fsdp(module, init_device_mesh("cuda", (1,)))
    return module


@pytest.fixture
def nccl_group():
    """A single-rank NCCL group on the current CUDA device (an in-memory store, no network)."""
    if dist.is_initialized():
        raise RuntimeError("a default process group is already initialized in this process")
    device = torch.device("cuda", torch.cuda.current_device())
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1, device_id=device)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_an_fsdp_bf16_inference_engine_computes_in_bf16_on_cuda(nccl_group):
    engine = InferenceEngine(sharded_model(), EngineConfig(dtype="bf16"), device="cuda")
    assert engine.dtype == torch.bfloat16
    with ComputeDtypeCheck(torch.bfloat16) as check:
        logits = engine.forward(make_batch(LENGTHS, seed=1))
    assert check.checked >= 2 * 4  # q/k/v/o and the MLP's products of two layers, at least
    assert logits.shape[0] == sum(LENGTHS) and bool(torch.isfinite(logits.float()).all())


def test_an_fsdp_bf16_train_engine_steps_in_bf16_on_cuda(nccl_group):
    """Its dry forward (FSDP2's lazy initialisation), then a whole train step, under the check:
    master weights stay fp32, every product runs in bf16, and the step moves the weights."""
    with ComputeDtypeCheck(torch.bfloat16) as check:
        engine = TrainEngine(
            sharded_model(), OptimizerConfig(lr=1e-2), EngineConfig(dtype="bf16"), device="cuda"
        )
    assert check.checked > 0 and {p.dtype for p in engine.module.parameters()} == {torch.float32}
    before = [p.detach().full_tensor().clone() for p in engine.module.parameters()]
    with ComputeDtypeCheck(torch.bfloat16) as check:
        stats = engine.train_batch(
            make_batch(LENGTHS, seed=2), None, token_loss, n_loss_tokens, version_steps=0
        )
    assert check.checked > 0 and stats["grad_norm"] > 0 and stats["update_skipped"] == 0
    after = [p.detach().full_tensor() for p in engine.module.parameters()]
    assert any(not torch.equal(a, b) for a, b in zip(before, after))
