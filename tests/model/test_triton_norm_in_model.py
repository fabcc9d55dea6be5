"""The Triton RMSNorm is chosen for a model's own norms, not only for plain tensors handed to it:
an ``RMSNorm`` module's weight is an ``nn.Parameter``, which the kernel reads like any dense
tensor, while a DTensor (tensor parallelism, FSDP2's sharded parameters) is refused.

The decision is checked here on the CPU; the kernel itself runs through the model in Triton's
interpreter (``TRITON_INTERPRET=1``, in a subprocess: the interpreter is chosen when the kernel is
built, once per process), skipped where Triton is not installed."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from torch import nn

from realrl.impl.model.kernels import triton_norm
from realrl.impl.model.kernels.native import DISABLE_ENV
from realrl.impl.model.modules.norm import RMSNorm


@pytest.fixture
def cpu_mesh(one_rank_group):
    """A one-rank device mesh over an in-memory gloo group."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (1,))


def test_a_norm_modules_own_weight_is_covered():
    norm = RMSNorm(32, 1e-6)
    x = torch.randn(5, 32, dtype=torch.bfloat16)
    assert type(norm.weight) is nn.Parameter
    assert triton_norm.covers(x, norm.weight)
    assert triton_norm.covers(x.view(5, 4, 8), RMSNorm(8, 1e-6).weight)  # qwen3's per-head q/k norms
    assert not triton_norm.covers(x, RMSNorm(31, 1e-6).weight)  # a weight per column, or nothing
    assert not triton_norm.covers(x, norm.weight.detach().to_sparse())  # no strided memory to read


def test_the_kernel_runs_on_cuda_and_on_the_cpu_only_in_triton_s_interpreter(monkeypatch):
    monkeypatch.delenv(triton_norm.INTERPRET_ENV, raising=False)
    assert triton_norm.runs_on(torch.device("cuda", 0))
    assert not triton_norm.runs_on(torch.device("cpu"))
    monkeypatch.setenv(triton_norm.INTERPRET_ENV, "1")
    assert triton_norm.runs_on(torch.device("cpu"))


def test_dtensor_weights_and_fsdp_s_sharded_parameters_are_refused(cpu_mesh):
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate, distribute_tensor

    x = torch.randn(5, 32, dtype=torch.bfloat16)
    replicated = distribute_tensor(torch.ones(32), cpu_mesh, [Replicate()])
    assert not triton_norm.covers(x, replicated)
    assert not triton_norm.covers(x, nn.Parameter(replicated))  # a parameter of a DTensor is one
    norm = RMSNorm(32, 1e-6)
    fully_shard(norm, mesh=cpu_mesh)
    assert isinstance(norm.weight, nn.Parameter) and not triton_norm.covers(x, norm.weight)


IN_MODEL = """
import torch
from model_fixtures import packed, tiny_config
from realrl.impl.model.kernels import dispatch, torch_only
from realrl.impl.model.kernels.norm import torch_rms_norm
from realrl.impl.model.kernels.triton_norm import triton_rms_norm
from realrl.impl.model.nn.real_model import ReaLModel

torch.manual_seed(0)
model = ReaLModel(tiny_config(qk_layernorm=True), dtype=torch.bfloat16).eval()
norm = model.layers[0].attn_ln
x = (torch.randn(9, norm.weight.shape[0]) * 3).to(torch.bfloat16)
with torch.no_grad():  # the calls the kernel serves: no gradient needed
    assert dispatch.use_triton("rms_norm", x, weight=norm.weight)
    got = norm(x)
    kernel, expression = triton_rms_norm(x, norm.weight, norm.eps), torch_rms_norm(x, norm.weight, norm.eps)
# the module's output is the kernel's, bit for bit, and the kernel's differs from the torch
# expression's here (the interpreter rounds fp32 to bf16 towards zero): the module took the kernel
assert torch.equal(got, kernel) and not torch.equal(kernel, expression)
torch.testing.assert_close(got, expression)
assert not dispatch.use_triton("rms_norm", x, weight=norm.weight)  # training: autograd's ops

ids, cu = packed([7, 3, 11])
ids = ids % model.config.vocab_size
with torch.no_grad():
    with_kernel = model(ids, cu).float()
    with torch_only("rms_norm"):
        without = model(ids, cu).float()
assert not torch.equal(with_kernel, without)  # the model's norms ran the kernel
torch.testing.assert_close(with_kernel, without, rtol=0.05, atol=0.05)  # bf16 logits, a few roundings
print("model checked")
"""


def test_a_models_norms_run_the_kernel_in_triton_s_interpreter():
    pytest.importorskip("triton")
    here = os.path.dirname(os.path.abspath(__file__))
    env = {
        **os.environ,
        triton_norm.INTERPRET_ENV: "1",
        DISABLE_ENV: "",  # the kernels on
        "PYTHONPATH": os.pathsep.join([here, os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, "-c", IN_MODEL], env=env, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "model checked" in done.stdout


@pytest.mark.gpu
def test_on_a_gpu_a_models_norms_take_the_kernel():
    from model_fixtures import tiny_config

    from realrl.impl.model.kernels import dispatch
    from realrl.impl.model.kernels.norm import torch_rms_norm
    from realrl.impl.model.kernels.triton_norm import triton_rms_norm
    from realrl.impl.model.nn.real_model import ReaLModel

    model = ReaLModel(tiny_config(hidden_dim=256), dtype=torch.bfloat16, device="cuda").eval()
    norm = model.final_ln
    x = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        assert dispatch.use_triton("rms_norm", x, weight=norm.weight)
        got = norm(x)
    assert torch.equal(got, triton_rms_norm(x, norm.weight, norm.eps))
    torch.testing.assert_close(got, torch_rms_norm(x, norm.weight, norm.eps))
