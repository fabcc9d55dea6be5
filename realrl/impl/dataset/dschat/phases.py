"""DeepSpeed-Chat's padded phase formats (the per-phase routing of its ``data_utils.py``), for users of
padded batches. realrl's own datasets are packed; see ``dataset.py`` for those."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812

from realrl.impl.dataset.dschat.base import PromptRawDataset


def _encode_padded(tokenizer: Any, text: str, max_seq_len: int) -> dict[str, torch.Tensor]:
    t = tokenizer(text, max_length=max_seq_len, padding="max_length", truncation=True, return_tensors="pt")
    return {"input_ids": t["input_ids"].squeeze(0), "attention_mask": t["attention_mask"].squeeze(0)}


def prepare_data(
    sample: Mapping[str, Any],
    raw_dataset: PromptRawDataset,
    train_phase: int,
    tokenizer: Any,
    max_seq_len: int,
    eos_token: str,
) -> dict[str, torch.Tensor] | None:
    """Route one raw row to its phase's format; None when the row has no such text (or, in
    phase 3, when the prompt is longer than ``max_seq_len``).

    Phase 1: prompt + chosen + EOS padded to ``max_seq_len``, labels -100 on padding.
    Phase 2: chosen and rejected, each prompt + answer + EOS, padded.
    Phase 3: the prompt alone, flipped so that padding the flipped rows on the right and flipping
    back gives left-padded prompts (``DataCollatorRLHF``).
    """
    if train_phase == 1:
        text = raw_dataset.get_prompt_and_chosen(sample)
        if text is None:
            return None
        tokens = _encode_padded(tokenizer, text + eos_token, max_seq_len)
        labels = torch.where(tokens["attention_mask"].bool(), tokens["input_ids"], -100)
        return {**tokens, "labels": labels}
    if train_phase == 2:
        chosen = raw_dataset.get_prompt_and_chosen(sample)
        rejected = raw_dataset.get_prompt_and_rejected(sample)
        if chosen is None or rejected is None:
            return None
        c = _encode_padded(tokenizer, chosen + eos_token, max_seq_len)
        r = _encode_padded(tokenizer, rejected + eos_token, max_seq_len)
        return {
            "chosen_input_ids": c["input_ids"],
            "chosen_attention_mask": c["attention_mask"],
            "rejected_input_ids": r["input_ids"],
            "rejected_attention_mask": r["attention_mask"],
        }
    if train_phase == 3:
        prompt = raw_dataset.get_prompt(sample)
        if prompt is None:
            return None
        t = tokenizer(prompt, return_tensors="pt")
        if t["input_ids"].shape[-1] > max_seq_len:
            return None
        return {k: t[k].squeeze(0).flip(0) for k in ("input_ids", "attention_mask")}
    raise ValueError(f"train_phase must be 1, 2 or 3, got {train_phase}")


class DataCollatorReward:
    """Phase 2 batch: (2N, L) with the N chosen rows then the N rejected rows."""

    def __call__(self, data: Sequence[Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        return {
            "input_ids": torch.stack(
                [f["chosen_input_ids"] for f in data] + [f["rejected_input_ids"] for f in data]
            ),
            "attention_mask": torch.stack(
                [f["chosen_attention_mask"] for f in data] + [f["rejected_attention_mask"] for f in data]
            ),
        }


class DataCollatorRLHF:
    """Phase 3 batch: left-padded prompts of width ``max(max_token_len, longest)``.

    The rows arrive flipped; padding them on the right and flipping the batch back puts the
    padding on the left, where generation wants it.
    """

    def __init__(self, max_token_len: int, pad_token_id: int):
        self.max_token_len = max_token_len
        self.pad_token_id = pad_token_id

    def __call__(self, data: Sequence[Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        pad = torch.nn.utils.rnn.pad_sequence
        prompt = pad([f["input_ids"] for f in data], batch_first=True, padding_value=self.pad_token_id)
        mask = pad([f["attention_mask"] for f in data], batch_first=True, padding_value=0)
        extra = self.max_token_len - prompt.shape[-1]
        if extra > 0:
            prompt = F.pad(prompt, (0, extra), value=self.pad_token_id)
            mask = F.pad(mask, (0, extra), value=0)
        return {"prompt": prompt.flip(1), "prompt_att_mask": mask.flip(1)}
