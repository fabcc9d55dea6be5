"""ReaLModel gives the same logits as transformers for every family, loaded or saved."""

from __future__ import annotations

import torch
import transformers
from model_fixtures import packed

from realrl.impl.model.nn.real_model import ReaLModel

LENGTHS = [7, 1, 12, 3, 9]


def hf_logits_per_sequence(hf_model, ids: torch.Tensor, cu: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return torch.cat(
            [hf_model(ids[a:b][None]).logits[0] for a, b in zip(cu[:-1].tolist(), cu[1:].tolist())]
        )


def test_packed_forward_matches_hf(hf_checkpoint):
    kind, hf_model, path = hf_checkpoint
    model = ReaLModel.from_pretrained(path).eval()
    ids, cu = packed(LENGTHS)
    with torch.no_grad():
        ours = model(ids, cu)
    ref = hf_logits_per_sequence(hf_model, ids, cu)
    assert ours.shape == (sum(LENGTHS), hf_model.config.vocab_size)
    assert (ours - ref).abs().max().item() <= 1e-4, kind


def test_save_pretrained_loads_in_transformers(hf_checkpoint, tmp_path):
    kind, hf_model, path = hf_checkpoint
    model = ReaLModel.from_pretrained(path).eval()
    out = tmp_path / "saved"
    model.save_pretrained(str(out))
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    ids, cu = packed(LENGTHS, seed=2)
    ref = hf_logits_per_sequence(hf_model, ids, cu)
    assert (hf_logits_per_sequence(reloaded, ids, cu) - ref).abs().max().item() <= 1e-5, kind
    # and the saved folder reads back into ReaLModel unchanged
    again = ReaLModel.from_pretrained(str(out)).eval()
    with torch.no_grad():
        assert torch.equal(again(ids, cu), model(ids, cu))
    assert again.config == model.config


def test_random_init_round_trip(tmp_path):
    """A config-built model (no HF origin) saves as llama and transformers agrees on its logits."""
    from realrl.api.core.model_api import ReaLModelConfig

    cfg = ReaLModelConfig(
        n_layers=2, n_q_heads=4, n_kv_heads=2, hidden_dim=32, intermediate_dim=48, vocab_size=50
    )
    torch.manual_seed(3)
    model = ReaLModel(cfg).eval()
    model.save_pretrained(str(tmp_path / "m"))
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "m")).eval()
    assert hf_model.config.model_type == "llama"
    ids, cu = packed([4, 6], seed=4)
    ids = ids % 50
    with torch.no_grad():
        assert (model(ids, cu) - hf_logits_per_sequence(hf_model, ids, cu)).abs().max().item() <= 1e-4


def test_save_is_atomic_over_an_existing_folder(tmp_path):
    from realrl.api.core.model_api import ReaLModelConfig

    cfg = ReaLModelConfig(
        n_layers=1, n_q_heads=2, n_kv_heads=2, hidden_dim=16, intermediate_dim=32, vocab_size=40
    )
    target = tmp_path / "ckpt"
    ReaLModel(cfg).save_pretrained(str(target))
    model = ReaLModel(cfg)
    model.save_pretrained(str(target))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # no temp or old folders left
    again = ReaLModel.from_pretrained(str(target))
    assert all(torch.equal(a, b) for a, b in zip(again.state_dict().values(), model.state_dict().values()))
