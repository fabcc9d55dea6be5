"""One-sample ``SequenceSample`` builders shared by every dataset (key contract: docs/datasets.md)."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np
import torch

from realrl.api.core.data_api import KeyKind, SequenceSample, register_key_spec

# Per-pair preference margin, repeated on the chosen and the rejected sequence of its pair so it
# lines up with the per-sequence ``rewards`` of a reward model: margin_j = margins[2j] = margins[2j+1].
register_key_spec("margins", KeyKind.SEQUENCE, torch.float32)


def _long(ids: Sequence[int]) -> torch.Tensor:
    """An int64 tensor of token ids; through numpy, which reads a list of ints a few times faster
    than ``torch.tensor`` (the same values and dtype)."""
    return torch.from_numpy(np.array(ids, dtype=np.int64))


def _meta(metadata: dict[str, Any] | None) -> dict[str, list[Any]]:
    return {k: [v] for k, v in (metadata or {}).items()}


def sft_sample(
    id_: Hashable,
    prompt_ids: Sequence[int],
    answer_ids: Sequence[int],
    loss_on_prompt: bool = False,
    metadata: dict[str, Any] | None = None,
    answer_mask: Sequence[bool] | None = None,
) -> SequenceSample:
    """``packed_input_ids`` = prompt + answer; ``prompt_mask`` is 1 on the prompt, or 0 there when
    the loss covers the prompt too (DeepSpeed-Chat's phase 1). ``answer_mask`` (one per answer
    token): 1 on answer tokens not trained on either, such as a trajectory's tool turns."""
    ids = list(prompt_ids) + list(answer_ids)
    n_prompt = 0 if loss_on_prompt else len(prompt_ids)
    mask = torch.from_numpy(np.arange(len(ids)) < n_prompt)
    if answer_mask is not None:
        if len(answer_mask) != len(answer_ids):
            raise ValueError(
                f"sample {id_!r}: {len(answer_mask)} answer mask entries for {len(answer_ids)} tokens"
            )
        mask[len(prompt_ids) :] = torch.from_numpy(np.array(answer_mask, dtype=bool))
    return SequenceSample.from_default(
        ids=[id_],
        seqlens=[len(ids)],
        data={"packed_input_ids": _long(ids), "prompt_mask": mask},
        metadata=_meta(metadata),
    )


def paired_sample(
    id_: Hashable,
    pairs: Sequence[tuple[Sequence[int], Sequence[int]]],
    margins: Sequence[float] | None = None,
    metadata: dict[str, Any] | None = None,
) -> SequenceSample:
    """``packed_input_ids`` holds [c1, r1, c2, r2, ...]; optional ``margins`` (one per pair)."""
    if not pairs:
        raise ValueError(f"sample {id_!r}: a reward-modeling sample needs at least one pair")
    seqs = [list(s) for pair in pairs for s in pair]
    data = {"packed_input_ids": _long([t for s in seqs for t in s])}
    if margins is not None:
        if len(margins) != len(pairs):
            raise ValueError(f"sample {id_!r}: {len(margins)} margins for {len(pairs)} pairs")
        data["margins"] = torch.tensor([float(m) for m in margins for _ in range(2)], dtype=torch.float32)
    return SequenceSample.from_default(
        ids=[id_], seqlens=[[len(s) for s in seqs]], data=data, metadata=_meta(metadata)
    )


def prompt_sample(
    id_: Hashable, prompt_ids: Sequence[int], metadata: dict[str, Any] | None = None
) -> SequenceSample:
    """``packed_prompts``: the prompt's token ids (PPO / GRPO)."""
    return SequenceSample.from_default(
        ids=[id_],
        seqlens=[len(prompt_ids)],
        data={"packed_prompts": _long(list(prompt_ids))},
        metadata=_meta(metadata),
    )


def pairs_of(sample: SequenceSample) -> list[tuple[list[int], list[int]]]:
    """The (chosen, rejected) token lists of a one-sample ``rw_paired`` SequenceSample."""
    lens = sample.seqlens["packed_input_ids"][0]
    flat = sample.data["packed_input_ids"].tolist()
    seqs, off = [], 0
    for n in lens:
        seqs.append(flat[off : off + n])
        off += n
    return [(seqs[i], seqs[i + 1]) for i in range(0, len(seqs), 2)]
