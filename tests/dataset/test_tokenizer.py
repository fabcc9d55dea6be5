"""load_hf_tokenizer: local folders only, pad handling per "The N Implementation Details of RLHF with PPO",
general detail 2."""

import pytest
from dataset_tokenizer import EOS, PAD, build_tokenizer

from realrl.api.core.data_api import load_hf_tokenizer


def test_existing_distinct_pad_is_kept(tmp_path, realrl_logs):
    tok = load_hf_tokenizer(build_tokenizer(str(tmp_path), with_pad=True))
    assert tok.pad_token == PAD and tok.pad_token_id != tok.eos_token_id
    assert not any("pad" in m for m in realrl_logs if m.startswith("WARNING"))


def test_missing_pad_becomes_eos_with_a_warning(tmp_path, realrl_logs):
    tok = load_hf_tokenizer(build_tokenizer(str(tmp_path)))
    assert tok.pad_token_id == tok.eos_token_id
    assert any(m.startswith("WARNING") and "no pad token" in m for m in realrl_logs)


def test_saved_pad_equal_to_eos_is_not_silent(tmp_path, realrl_logs):
    tok = load_hf_tokenizer(build_tokenizer(str(tmp_path), pad_is_eos=True))
    assert tok.pad_token == EOS
    assert any(m.startswith("WARNING") and "uses EOS" in m for m in realrl_logs)


@pytest.mark.parametrize("pad_is_eos", [False, True])
def test_distinct_pad_token_on_request(tmp_path, pad_is_eos, realrl_logs):
    path = build_tokenizer(str(tmp_path), pad_is_eos=pad_is_eos)
    before = len(load_hf_tokenizer(path))
    tok = load_hf_tokenizer(path, distinct_pad_token=True, pad_token="[PAD]")
    assert tok.pad_token == "[PAD]"
    assert tok.pad_token_id != tok.eos_token_id
    assert len(tok) == before + 1 and tok.pad_token_id == before
    assert any("resize" in m for m in realrl_logs)
    # padding a batch can no longer be confused with a real EOS
    batch = tok.pad({"input_ids": [[5, tok.eos_token_id], [5]]}, return_tensors="pt")
    assert batch["input_ids"][1, 1] == tok.pad_token_id != tok.eos_token_id


def test_padding_side_and_bad_inputs(tmp_path):
    path = build_tokenizer(str(tmp_path), with_pad=True)
    assert load_hf_tokenizer(path, padding_side="left").padding_side == "left"
    with pytest.raises(ValueError, match="padding_side"):
        load_hf_tokenizer(path, padding_side="middle")
    with pytest.raises(ValueError, match="cannot load a tokenizer"):
        load_hf_tokenizer(str(tmp_path / "nowhere"))
