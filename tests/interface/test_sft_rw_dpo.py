"""sft, paired_rw and dpo on a tiny ReaLModel behind the real engines."""

import json
import math

import pytest
import torch
from interface_fixtures import make_model, paired_batch, prompt_answer_batch

from realrl.api.core.config import ModelInterfaceAbstraction
from realrl.api.core.model_api import make_interface
from realrl.impl.interface.dpo_interface import pair_answer_mask

PAIRS = [("w1 w2", "good great ."), ("w3", "w4 w5 w6 ."), ("w7 w8 w9", "bad .")]


def test_sft_counts_answer_tokens_and_learns(tokenizer):
    model = make_model(tokenizer)
    sft = make_interface("sft")
    batch = prompt_answer_batch(tokenizer, PAIRS)
    losses = [sft.train_step(model, batch)["loss"] for _ in range(15)]
    assert losses[-1] < 0.5 * losses[0]
    assert model.version.global_step == 15
    ev = sft.evaluate(model, [batch])
    assert ev["eval_n_tokens"] == 3 + 4 + 2  # answer tokens only: the prompt is masked
    assert ev["eval_ppl"] == pytest.approx(math.exp(ev["eval_loss"]))


def test_sft_on_all_tokens_when_prompt_mask_is_zero(tokenizer):
    model = make_model(tokenizer, train=False)
    batch = prompt_answer_batch(tokenizer, PAIRS)
    batch.data["prompt_mask"] = torch.zeros_like(batch.data["prompt_mask"])
    ev = make_interface("sft").evaluate(model, [batch])
    assert ev["eval_n_tokens"] == sum(len(p.split()) + len(a.split()) - 1 for p, a in PAIRS)


RW_ROWS = [
    [("w1 good great .", "w1 bad awful ."), ("w2 good .", "w2 bad .")],
    [("w3 great good .", "w3 awful bad .")],
]


def test_paired_rw_learns_and_reports_accuracy(tokenizer):
    model = make_model(tokenizer, critic=True)
    rw = make_interface("paired_rw")
    batch = paired_batch(tokenizer, RW_ROWS)
    first = rw.train_step(model, batch)
    for _ in range(20):
        last = rw.train_step(model, batch)
    assert last["loss"] < first["loss"]
    assert last["accuracy"] == 1.0
    ev = rw.evaluate(model, [batch])
    assert ev["eval_accuracy"] == 1.0 and ev["eval_n_pairs"] == 3
    out = rw.inference(model, batch)
    assert out.seqlens["rewards"] == [[1, 1, 1, 1], [1, 1]]
    r = out.data["rewards"]
    assert (r[0::2] > r[1::2]).all()


def test_paired_rw_reads_the_last_token_and_honours_margins(tokenizer):
    model = make_model(tokenizer, critic=True, train=False)
    batch = paired_batch(tokenizer, RW_ROWS, margins=[[0.5, 1.0], [2.0]])
    cu = batch.cu_seqlens("packed_input_ids")
    values = model.module.forward(batch)
    rw = make_interface("paired_rw")
    torch.testing.assert_close(rw.inference(model, batch).data["rewards"], values[(cu[1:] - 1).long()])
    last = values[(cu[1:] - 1).long()]
    loss, _ = rw._pair_loss(last, batch)  # the engine hands the loss the reward tokens' outputs
    c, r = last[0::2], last[1::2]
    expected = -torch.nn.functional.logsigmoid(c - r - torch.tensor([0.5, 1.0, 2.0])).mean()
    torch.testing.assert_close(loss, expected)


def test_paired_rw_before_eos_position(tokenizer):
    model = make_model(tokenizer, critic=True, train=False)
    batch = paired_batch(tokenizer, [[("w1 good <eos>", "w1 bad")]])
    values = model.module.forward(batch)
    rw = make_interface(ModelInterfaceAbstraction("paired_rw", {"reward_position": "before_eos"}))
    r = rw.inference(model, batch).data["rewards"]
    torch.testing.assert_close(r, torch.stack([values[1], values[4]]))  # "good" (before EOS), "bad" (last)


def test_reward_normalisation_fits_mean_zero_std_one_and_is_saved(tokenizer, tmp_path):
    model = make_model(tokenizer, critic=True, train=False)
    batch = prompt_answer_batch(tokenizer, PAIRS + [("w10", "w11 w12 ."), ("w13 w14", "great .")])
    rw = make_interface(ModelInterfaceAbstraction("paired_rw", {"normalize_on_first_inference": True}))
    r = rw.inference(model, batch).data["rewards"].double()
    assert float(r.mean()) == pytest.approx(0.0, abs=1e-5)
    assert float(r.std(unbiased=False)) == pytest.approx(1.0, abs=1e-4)
    gain, bias = rw.gain, rw.bias
    rw.save(model, str(tmp_path / "rm"))
    saved = json.loads((tmp_path / "rm" / "reward_normalization.json").read_text())
    assert saved == {"gain": gain, "bias": bias}
    assert (tmp_path / "rm" / "config.json").exists()
    again = make_interface(
        ModelInterfaceAbstraction("paired_rw", {"normalization_file": str(tmp_path / "rm")})
    )
    torch.testing.assert_close(again.inference(model, batch).data["rewards"], r.float())


def test_paired_rw_rejects_odd_sequence_counts(tokenizer):
    model = make_model(tokenizer, critic=True)
    batch = paired_batch(tokenizer, [[("w1 good", "w1 bad")]])
    batch.seqlens["packed_input_ids"] = [[sum(batch.seqlens["packed_input_ids"][0])]]
    with pytest.raises(ValueError, match="expected \\[c1, r1"):
        make_interface("paired_rw").train_step(model, batch)


def test_pair_answer_mask_uses_the_common_prefix(tokenizer):
    batch = paired_batch(tokenizer, [[("w1 w2 good .", "w1 w2 bad awful .")]])
    # common prefix "w1 w2" (2 tokens): entries for targets at positions >= 2
    assert pair_answer_mask(batch).tolist() == [False, True, True, False, True, True, True]


def test_dpo_starts_at_log2_and_separates_the_pair(tokenizer):
    policy = make_model(tokenizer, lr=5e-3)
    ref = make_model(tokenizer, role="ref", train=False)  # same seed: identical weights
    dpo = make_interface("dpo")
    batch = paired_batch(tokenizer, RW_ROWS)
    batch.update_(dpo.inference(ref, batch))
    first = dpo.train_step(policy, batch)
    assert first["loss"] == pytest.approx(math.log(2), abs=1e-5)
    for _ in range(10):
        last = dpo.train_step(policy, batch)
    assert last["loss"] < first["loss"]
    assert last["chosen_reward"] > last["rejected_reward"]


def test_dpo_ipo_option_runs_and_validates(tokenizer):
    policy = make_model(tokenizer)
    ipo = make_interface(ModelInterfaceAbstraction("dpo", {"loss_type": "ipo", "beta": 0.5}))
    batch = paired_batch(tokenizer, RW_ROWS)
    batch.update_(ipo.inference(policy, batch))
    stats = ipo.train_step(policy, batch)
    assert stats["loss"] == pytest.approx(1.0)  # h = 0 at the start: (0 - 1 / (2 * 0.5))^2
    with pytest.raises(ValueError, match="loss_type"):
        make_interface(ModelInterfaceAbstraction("dpo", {"loss_type": "hinge"}))
