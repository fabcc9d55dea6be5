"""CUDA backends (bf16): torch_varlen and flash_attn agree with the exact sdpa path.

Skipped without a CUDA device (tests/conftest.py)."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from model_fixtures import make_hf_model, packed

from realrl.api.core.model_api import GenerationHyperparameters
from realrl.impl.model.nn.real_model import ReaLModel
from realrl.impl.model.utils.functional import gather_packed_shifted_log_probs

LENGTHS = [17, 1, 40, 9, 23]


def _backends() -> list[str]:
    names = ["torch_varlen"]
    if importlib.util.find_spec("flash_attn") is not None:
        names.append("flash_attn")
    return names


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["llama", "mistral", "qwen3", "gpt2"])
@pytest.mark.parametrize("impl", _backends())
def test_cuda_backend_matches_sdpa_bf16(kind, impl, tmp_path):
    make_hf_model(kind).save_pretrained(tmp_path / kind)
    path = str(tmp_path / kind)
    ref = ReaLModel.from_pretrained(path, dtype=torch.bfloat16, attn_impl="sdpa", device="cuda").eval()
    fast = ReaLModel.from_pretrained(path, dtype=torch.bfloat16, attn_impl=impl, device="cuda").eval()
    assert fast.attn_impl == impl
    ids, cu = (t.cuda() for t in packed(LENGTHS))
    with torch.no_grad():
        a, b = ref(ids, cu).float(), fast(ids, cu).float()
    assert (a - b).abs().max().item() < 0.05 * a.abs().max().item()


@pytest.mark.gpu
def test_auto_picks_a_cuda_kernel_and_generation_runs(tmp_path):
    make_hf_model("llama").save_pretrained(tmp_path / "m")
    model = ReaLModel.from_pretrained(str(tmp_path / "m"), dtype=torch.bfloat16, device="cuda").eval()
    assert model.attn_impl in ("flash_attn", "torch_varlen")
    ids, cu = (t.cuda() for t in packed([5, 9, 3]))
    g = GenerationHyperparameters(n=2, max_new_tokens=12, temperature=0.8)
    out = model.generate(ids, cu, g, eos_token_id=1)
    cu_out = torch.zeros(len(out.seqlens) + 1, dtype=torch.int32, device="cuda")
    cu_out[1:] = torch.tensor(out.seqlens, device="cuda").cumsum(0)
    with torch.no_grad():
        ref = gather_packed_shifted_log_probs(
            model(out.sequences, cu_out).float() / 0.8, cu_out, out.sequences
        )
    resp = out.logprobs != 0
    assert (out.logprobs[resp] - ref[resp]).abs().max().item() < 0.1


@pytest.mark.gpu
def test_model_moved_to_cuda_reresolves_auto(tmp_path):
    make_hf_model("llama").save_pretrained(tmp_path / "m")
    model = ReaLModel.from_pretrained(str(tmp_path / "m"), dtype=torch.bfloat16).eval()
    assert model.attn_impl == "sdpa"
    model.cuda()
    ids, cu = (t.cuda() for t in packed([4, 6]))
    with torch.no_grad():
        model(ids, cu)
    assert model.attn_impl in ("flash_attn", "torch_varlen")


@pytest.mark.gpu
def test_fp32_model_built_on_cuda_takes_sdpa(tmp_path):
    """Weights in the default fp32 on a GPU: the varlen kernels do not apply, from the start."""
    make_hf_model("llama").save_pretrained(tmp_path / "m")
    model = ReaLModel.from_pretrained(str(tmp_path / "m"), dtype=torch.float32, device="cuda").eval()
    assert model.attn_impl == "sdpa"
    ids, cu = (t.cuda() for t in packed([4, 6]))
    with torch.no_grad():
        assert torch.isfinite(model(ids, cu)).all()
