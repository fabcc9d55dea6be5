"""Token sequences back to (prompt, completion) texts, one pair per sequence."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from realrl.api.core.data_api import SequenceSample
from realrl.impl.interface.common import INPUT_KEY, sequence_ids


def prompt_lengths(data: SequenceSample) -> list[int]:
    """Prompt length of every sequence: the leading run of ``prompt_mask`` (a multi-turn
    trajectory's observations, later, are masked too but belong to the completion), else from
    ``packed_prompts`` (one prompt per sample, shared by its answers)."""
    lens = data.flat_seqlens(INPUT_KEY)
    if "prompt_mask" in data.keys and data.data["prompt_mask"] is not None:
        mask, out, off = data.data["prompt_mask"].long().tolist(), [], 0
        for n in lens:
            row = mask[off : off + n]
            out.append(row.index(0) if 0 in row else n)
            off += n
        return out
    if "packed_prompts" in data.keys and data.data["packed_prompts"] is not None:
        out = []
        for p_row, s_row in zip(data.seqlens["packed_prompts"], data.seqlens[INPUT_KEY]):
            out.extend([sum(p_row)] * len(s_row))
        return out
    raise ValueError(
        f"cannot split prompts from completions: the input has neither 'prompt_mask' nor 'packed_prompts' "
        f"(has {sorted(data.keys)}); add one of them to the MFC's input_keys"
    )


def prompts_and_completions(
    data: SequenceSample, tokenizer: Any, skip_special_tokens: bool = True
) -> tuple[list[Hashable], list[str], list[str]]:
    """(sequence ids, prompt texts, completion texts), one entry per sequence."""
    if tokenizer is None:
        raise ValueError("decoding texts needs the model's tokenizer, but model.tokenizer is None")
    ids = data.data[INPUT_KEY].tolist()
    prompt_ids, completion_ids, off = [], [], 0
    for n, p in zip(data.flat_seqlens(INPUT_KEY), prompt_lengths(data)):
        prompt_ids.append(ids[off : off + p])
        completion_ids.append(ids[off + p : off + n])
        off += n
    # one batch call each: a fast tokenizer decodes the whole batch in Rust
    prompts = tokenizer.batch_decode(prompt_ids, skip_special_tokens=skip_special_tokens)
    completions = tokenizer.batch_decode(completion_ids, skip_special_tokens=skip_special_tokens)
    return sequence_ids(data), prompts, completions


def turn_texts(data: SequenceSample, tokenizer: Any) -> list[list[dict[str, str]]]:
    """Each sequence's response cut into its turns, in order: ``{"model": text}`` for a run of the
    policy's tokens, ``{"env": text}`` for a run it did not sample (a multi-turn trajectory's
    observations; ``prompt_mask`` marks them). A single-turn answer is one ``model`` turn."""
    ids, mask = data.data[INPUT_KEY].tolist(), data.data["prompt_mask"].long().tolist()
    out, off = [], 0
    for n, p in zip(data.flat_seqlens(INPUT_KEY), prompt_lengths(data)):
        runs: list[tuple[str, list[int]]] = []
        for tok, m in zip(ids[off + p : off + n], mask[off + p : off + n]):
            role = "env" if m else "model"
            if runs and runs[-1][0] == role:
                runs[-1][1].append(tok)
            else:
                runs.append((role, [tok]))
        out.append([{role: tokenizer.decode(toks, skip_special_tokens=False)} for role, toks in runs])
        off += n
    return out
