"""A critic's new head (one loaded from a language model's checkpoint) is the same whatever device,
dtype or layout it is drawn on: the values come from a CPU generator seeded with the model's
``critic_head_seed``, then are copied where the head lives. A CUDA generator draws another stream
from the same seed, so a head drawn by the device's own generator would differ between devices.

A CPU-only build holds no CUDA tensor; a head whose parameters report a CUDA device (a tensor
subclass) stands in for one: a draw that asks for the generator of the head's device fails on
such a build, and draws CUDA's stream on a build with CUDA."""

from __future__ import annotations

import pytest
import torch
from model_fixtures import tiny_config
from torch import nn

from realrl.impl.model.nn.real_model import ReaLModel, reset_critic_head
from realrl.impl.model.parallel.pipeline import PipelineStage

SEED = 1234


class ReportsCuda(torch.Tensor):
    """A host tensor that reports living on the first CUDA device."""

    @property
    def device(self) -> torch.device:
        return torch.device("cuda", 0)


def reference_head(in_features: int) -> torch.Tensor:
    """N(0, 1/sqrt(d+1)) drawn in fp32 by a CPU generator seeded with ``SEED``."""
    std = 1.0 / (in_features + 1) ** 0.5
    return torch.empty(1, in_features).normal_(0.0, std, generator=torch.Generator().manual_seed(SEED))


def head_reporting_cuda(dtype: torch.dtype) -> nn.Linear:
    head = nn.Linear(32, 1, dtype=dtype)
    head.weight = nn.Parameter(head.weight.detach().as_subclass(ReportsCuda))
    head.bias = nn.Parameter(head.bias.detach().as_subclass(ReportsCuda))
    return head


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("on_cuda", [False, True])
def test_new_head_is_the_cpu_draw_on_any_device_and_dtype(dtype, on_cuda):
    head = head_reporting_cuda(dtype) if on_cuda else nn.Linear(32, 1, dtype=dtype)
    assert head.weight.device.type == ("cuda" if on_cuda else "cpu")
    reset_critic_head(head, "reward", SEED)
    assert torch.equal(head.weight.as_subclass(torch.Tensor), reference_head(32).to(dtype))
    assert torch.equal(head.bias.as_subclass(torch.Tensor), torch.zeros(1, dtype=dtype))


def test_new_head_does_not_move_the_global_rng():
    head = nn.Linear(32, 1)
    before = torch.get_rng_state()
    reset_critic_head(head, "reward", SEED)
    assert torch.equal(torch.get_rng_state(), before)


def test_critic_from_a_language_model_starts_alike_whole_and_as_a_last_stage(tmp_path):
    """The whole critic, and a pipeline's last stage (built by the loader that also splits by
    tensor parallelism, filled shard by shard), draw one head."""
    torch.manual_seed(0)
    ReaLModel(tiny_config(hf_model_type="llama")).save_pretrained(str(tmp_path))
    heads = []
    for cut in (None, lambda model: PipelineStage.of(model, 1, 2)):
        torch.manual_seed(0)  # the critic_head_seed every rank draws alike
        heads.append(ReaLModel.from_pretrained(str(tmp_path), is_critic=True, cut=cut).head)
    whole, stage = heads
    assert torch.equal(whole.weight, stage.weight) and torch.equal(whole.bias, stage.bias)


@pytest.mark.gpu
def test_critic_head_on_cuda_is_the_cpu_head():
    cpu, cuda = nn.Linear(64, 1), nn.Linear(64, 1, device="cuda")
    reset_critic_head(cpu, "reward", SEED)
    reset_critic_head(cuda, "reward", SEED)
    assert torch.equal(cuda.weight.cpu(), cpu.weight) and torch.equal(cuda.bias.cpu(), cpu.bias)
