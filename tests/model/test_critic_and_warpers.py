"""Critic heads (the reward-head init of "The N Implementation Details of RLHF with PPO", exact round trip),
logits warpers, and packing isolation."""

from __future__ import annotations

import math

import pytest
import torch
import transformers
from model_fixtures import make_hf_model, packed

from realrl.api.core.config import ModelAbstraction
from realrl.api.core.model_api import ReaLModelConfig, make_model
from realrl.impl.model.nn.real_model import ReaLModel
from realrl.impl.model.utils.logits_warper import top_k_filter, top_p_filter


def test_critic_from_lm_checkpoint_and_round_trip(tmp_path):
    hf = make_hf_model("llama")
    hf.save_pretrained(tmp_path / "lm")
    torch.manual_seed(0)
    critic = ReaLModel.from_pretrained(str(tmp_path / "lm"), is_critic=True).eval()
    d = critic.config.hidden_dim
    w = critic.head.weight
    assert w.shape == (1, d) and torch.all(critic.head.bias == 0)
    # N(0, 1/sqrt(d_model + 1)) as in the N Implementation Details post; d = 64 samples, so the std
    # is within loose bounds
    assert 0.5 / math.sqrt(d + 1) < w.std().item() < 1.5 / math.sqrt(d + 1)
    ids, cu = packed([4, 7, 2])
    with torch.no_grad():
        values = critic(ids, cu)
    assert values.shape == (13,)
    # the body is the LM's body: same hidden states as transformers' last hidden layer
    with torch.no_grad():
        hidden = hf.model(ids[:4][None]).last_hidden_state[0]
    assert (values[:4] - (hidden @ w[0] + critic.head.bias)).abs().max() < 1e-4

    critic.save_pretrained(str(tmp_path / "critic"))
    again = ReaLModel.from_pretrained(str(tmp_path / "critic"), is_critic=True).eval()
    with torch.no_grad():
        assert torch.equal(again(ids, cu), values)
    with pytest.raises(ValueError, match="is_critic=True"):
        ReaLModel.from_pretrained(str(tmp_path / "critic"))
    # transformers still loads the body of a saved critic
    body = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "critic")).model
    with torch.no_grad():
        assert (body(ids[:4][None]).last_hidden_state[0] - hidden).abs().max() < 1e-5


def test_value_head_zero_init():
    cfg = ReaLModelConfig(
        n_layers=1,
        n_q_heads=2,
        n_kv_heads=1,
        hidden_dim=16,
        intermediate_dim=32,
        vocab_size=30,
        is_critic=True,
    )
    critic = ReaLModel(cfg, critic_head_init="zeros")
    ids, cu = packed([3, 5])
    assert torch.all(critic(ids % 30, cu) == 0)


def test_model_factory_builds_real_and_null_models(tmp_path):
    hf = make_hf_model("gpt2")
    hf.save_pretrained(tmp_path / "g")
    m = make_model(ModelAbstraction("real_model", {"path": str(tmp_path / "g"), "is_critic": True}), "critic")
    assert isinstance(m.module, ReaLModel) and m.module.config.is_critic and m.tokenizer is None
    null = make_model(ModelAbstraction("null", {}), "reward")
    assert null.module is None
    with pytest.raises(ValueError, match="exactly one of"):
        make_model(ModelAbstraction("real_model", {}), "actor")


def test_top_k_keeps_k_largest_and_ties():
    logits = torch.tensor([[1.0, 5.0, 3.0, 3.0, -2.0]])
    out = top_k_filter(logits, 2)
    assert torch.isinf(out).tolist() == [[True, False, False, False, True]]  # tie at the 2nd value kept
    assert torch.equal(top_k_filter(logits, 0), logits)


def test_top_p_matches_transformers():
    torch.manual_seed(0)
    logits = torch.randn(6, 40) * 2
    for p in (0.3, 0.7, 0.95):
        ref = transformers.generation.logits_process.TopPLogitsWarper(p)(None, logits.clone())
        assert torch.equal(torch.isinf(top_p_filter(logits, p)), torch.isinf(ref))
    single = top_p_filter(torch.tensor([[10.0, 0.0, 0.0]]), 0.01)
    assert torch.isinf(single).tolist() == [[False, True, True]]  # the best token always survives


@pytest.mark.parametrize("kind", ["llama", "mistral", "gpt2"])
def test_no_attention_across_sequences(kind, tmp_path):
    hf = make_hf_model(kind)
    hf.save_pretrained(tmp_path / kind)
    model = ReaLModel.from_pretrained(str(tmp_path / kind)).eval()
    ids, cu = packed([6, 8, 5])
    changed = ids.clone()
    changed[6:14] = (changed[6:14] + 7) % 97  # only the middle sequence changes
    with torch.no_grad():
        a, b = model(ids, cu), model(changed, cu)
    assert torch.equal(a[:6], b[:6]) and torch.equal(a[14:], b[14:])
    assert not torch.allclose(a[6:14], b[6:14])


def test_sliding_window_is_applied(tmp_path):
    hf = make_hf_model("mistral")  # window 5
    hf.save_pretrained(tmp_path / "m")
    model = ReaLModel.from_pretrained(str(tmp_path / "m")).eval()
    ids, cu = packed([12])
    with torch.no_grad():
        windowed = model(ids, cu)
        for layer in model.layers:
            layer.attn.window = None
        full = model(ids, cu)
    # inside the window nothing changes (up to rounding: without a window the CPU kernel runs)
    torch.testing.assert_close(windowed[:5], full[:5], atol=1e-6, rtol=1e-6)
    assert not torch.allclose(windowed[6:], full[6:])


def test_bad_cu_seqlens_is_a_clear_error():
    cfg = ReaLModelConfig(
        n_layers=1, n_q_heads=2, n_kv_heads=2, hidden_dim=8, intermediate_dim=16, vocab_size=10
    )
    model = ReaLModel(cfg)
    with pytest.raises(ValueError, match="cu_seqlens"):
        model(torch.zeros(5, dtype=torch.long), torch.tensor([0, 3], dtype=torch.int32))


def test_sample_categorical_follows_the_distribution():
    """Frequencies over many rows, each with its own counter-based uniform, match the
    probabilities (a chi-square statistic with a loose bound; the draws are fixed by the keys)."""
    from realrl.impl.model.nn.sampling import row_uniforms, sample_categorical

    n = 20000
    probs = torch.tensor([0.5, 0.0, 0.2, 0.3])
    draws = sample_categorical(probs.expand(n, 4), row_uniforms(torch.arange(n), 0))
    counts = torch.bincount(draws, minlength=4).double()
    assert counts[1] == 0  # zero-probability tokens are never drawn
    nz = probs > 0
    chi2 = ((counts[nz] - n * probs[nz]) ** 2 / (n * probs[nz])).sum()
    assert chi2 < 20  # 2 degrees of freedom: P(chi2 > 20) ~ 5e-5
    # a one-hot row always gives its token, and a uniform just below 1 stays on the last positive one
    assert torch.all(
        sample_categorical(
            torch.tensor([[0.0, 0.0, 1.0, 0.0]]).expand(100, 4), row_uniforms(torch.arange(100), 3)
        )
        == 2
    )
    top = torch.tensor([1.0 - 2.0**-53], dtype=torch.float64)
    assert sample_categorical(torch.tensor([[0.3, 0.7, 0.0, 0.0]]), top).item() == 1


def test_sample_categorical_matches_softmax_over_a_vocabulary():
    from realrl.impl.model.nn.sampling import row_uniforms, sample_categorical

    n, v = 50000, 12
    probs = torch.softmax(torch.randn(v, generator=torch.Generator().manual_seed(0)) * 1.5, dim=-1)
    draws = sample_categorical(probs.expand(n, v), row_uniforms(torch.arange(n) * 7919 + 11, 5))
    counts = torch.bincount(draws, minlength=v).double()
    chi2 = ((counts - n * probs) ** 2 / (n * probs)).sum()
    assert chi2 < 40  # 11 degrees of freedom: P(chi2 > 40) ~ 4e-5


def _save_tokenizer(folder) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<pad>", "<eos>"] + [f"w{i}" for i in range(20)]
    tok = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>").save_pretrained(
        folder
    )


def test_factories_load_tokenizers(tmp_path):
    _save_tokenizer(tmp_path / "tok")
    cfg = dict(n_layers=1, n_q_heads=2, n_kv_heads=2, hidden_dim=16, intermediate_dim=32, vocab_size=22)
    m = make_model(
        ModelAbstraction("real_model", {"config": cfg, "tokenizer_path": str(tmp_path / "tok")}), "actor"
    )
    assert m.tokenizer.eos_token_id == 1 and m.module.config.vocab_size == 22
    # a checkpoint saved with its tokenizer brings it along
    m.module.save_pretrained(str(tmp_path / "ckpt"), tokenizer=m.tokenizer)
    again = make_model(
        ModelAbstraction("real_model", {"path": str(tmp_path / "ckpt"), "dtype": "bf16"}), "ref"
    )
    assert again.tokenizer.eos_token_id == 1 and again.module.dtype == torch.bfloat16
    null = make_model(ModelAbstraction("null", {"tokenizer_path": str(tmp_path / "tok")}), "reward")
    assert null.module is None and null.tokenizer.decode([2, 3]) == "w0 w1"
