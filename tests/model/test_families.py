"""Family registry contracts: parameter names, shard-wise conversion, checkpoint formats, dtypes."""

from __future__ import annotations

import pytest
import torch
from model_fixtures import FAMILIES, make_hf_model, packed

from realrl.api.core.hf_family import hf_family_for_model_type, registered_hf_families
from realrl.impl.model.nn.real_model import ReaLModel


def test_all_required_families_registered():
    assert {"llama", "qwen2", "qwen3", "mistral", "gpt2"} <= set(registered_hf_families())
    with pytest.raises(LookupError, match="supported"):
        hf_family_for_model_type("no-such-model")


@pytest.mark.parametrize("kind", FAMILIES)
@pytest.mark.parametrize("is_critic", [False, True])
def test_param_names_cover_the_state_dict(kind, is_critic, tmp_path):
    make_hf_model(kind).save_pretrained(tmp_path / kind)
    model = ReaLModel.from_pretrained(str(tmp_path / kind), is_critic=is_critic)
    fam = hf_family_for_model_type(model.config.hf_model_type)
    cfg = model.config
    names = fam.embedding_param_names(cfg) + fam.head_param_names(cfg)
    for i in range(cfg.n_layers):
        names += fam.tblock_param_names(cfg, i)
    assert sorted(names) == sorted(model.state_dict())


@pytest.mark.parametrize("kind", FAMILIES)
def test_converters_accept_one_layer_alone(kind, tmp_path):
    """A pipeline stage converts only its own parameters: one block round-trips by itself."""
    make_hf_model(kind).save_pretrained(tmp_path / kind)
    model = ReaLModel.from_pretrained(str(tmp_path / kind))
    fam, cfg = hf_family_for_model_type(model.config.hf_model_type), model.config
    sd = model.state_dict()
    block = {n: sd[n] for n in fam.tblock_param_names(cfg, 1)}
    back = fam.sd_from_hf(fam.sd_to_hf(block, cfg), cfg)
    assert sorted(back) == sorted(block)
    assert all(torch.equal(back[n], block[n]) for n in block)


def test_pytorch_bin_checkpoint_loads(tmp_path):
    hf = make_hf_model("qwen2")
    hf.save_pretrained(tmp_path / "st")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "config.json").write_text((tmp_path / "st" / "config.json").read_text())
    torch.save(hf.state_dict(), tmp_path / "bin" / "pytorch_model.bin")
    a = ReaLModel.from_pretrained(str(tmp_path / "st")).eval()
    b = ReaLModel.from_pretrained(str(tmp_path / "bin")).eval()
    ids, cu = packed([5, 3])
    with torch.no_grad():
        assert torch.equal(a(ids, cu), b(ids, cu))


def test_missing_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        ReaLModel.from_pretrained(str(tmp_path))


def test_bf16_forward_close_to_fp32(tmp_path):
    make_hf_model("llama").save_pretrained(tmp_path / "m")
    ids, cu = packed([9, 4, 11])
    with torch.no_grad():
        ref = ReaLModel.from_pretrained(str(tmp_path / "m")).eval()(ids, cu)
        low = ReaLModel.from_pretrained(str(tmp_path / "m"), dtype=torch.bfloat16).eval()(ids, cu)
    assert low.dtype == torch.bfloat16
    assert (low.float() - ref).abs().max().item() < 0.1 * ref.abs().max().item()


def test_training_forward_backward_reaches_every_parameter(tmp_path):
    make_hf_model("qwen3").save_pretrained(tmp_path / "m")
    model = ReaLModel.from_pretrained(str(tmp_path / "m")).train()
    ids, cu = packed([6, 9])
    model(ids, cu).float().logsumexp(-1).mean().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
