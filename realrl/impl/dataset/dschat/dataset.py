"""``dschat``: one corpus of DeepSpeed-Chat sources, cut by phase, as packed realrl samples.

Phase 1 gives ``prompt_answer``-style items, phase 2 ``rw_paired``-style items (one pair), phase 3
``prompt``-style items, so the SFT, reward and PPO experiments can share one corpus without
overlap (``data_split`` like "2,4,4"). Several sources are blended by ``weights``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from realrl.api.core.data_api import DatasetUtility, register_dataset
from realrl.impl.dataset.base import SampleListDataset, Skip
from realrl.impl.dataset.dschat.adapters import get_raw_dataset
from realrl.impl.dataset.dschat.blend import blend_indices
from realrl.impl.dataset.dschat.split import phase_indices
from realrl.impl.dataset.errors import DataError
from realrl.impl.dataset.samples import paired_sample, prompt_sample, sft_sample
from realrl.impl.dataset.sharding import shard_indices
from realrl.impl.dataset.tokenize import BatchTokenizer


def _source_list(sources: Sequence[Mapping[str, Any]] | Mapping[str, Any]) -> list[tuple[str, Any]]:
    if isinstance(sources, Mapping):
        return list(sources.items())
    out = []
    for j, s in enumerate(sources):
        if not isinstance(s, Mapping) or "name" not in s or "path" not in s:
            raise ValueError(
                f"dschat: sources[{j}] must be {{'name': <source>, 'path': <local copy>}}, got {s!r}"
            )
        out.append((s["name"], s["path"]))
    if not out:
        raise ValueError("dschat: no sources given")
    return out


class DSChatDataset(SampleListDataset):
    """Args: ``sources`` ({name: local copy} or [{"name", "path"}]), ``phase`` (1 SFT, 2 reward,
    3 PPO), ``data_split``, ``part`` ("train" / "eval"), ``weights`` and ``total`` for blending.

    Sequences over ``max_seq_len`` are left out and counted; ``truncate=True`` cuts phase-1/2
    sequences instead, as DeepSpeed-Chat does (phase-3 prompts are always left out, never cut).
    Phase 1 puts the loss on every token as DeepSpeed-Chat does; ``loss_on_prompt=False`` masks the prompt.
    Ids are "<source>:<part>:<row>" (with "#k" on the k-th repeat of a row when blending repeats).
    """

    def __init__(
        self,
        util: DatasetUtility,
        sources: Sequence[Mapping[str, Any]] | Mapping[str, Any],
        phase: int,
        data_split: str = "2,4,4",
        part: str = "train",
        weights: Sequence[float] | None = None,
        total: int | None = None,
        max_seq_len: int = 512,
        truncate: bool = False,
        loss_on_prompt: bool = True,
        end_of_conversation_token: str | None = None,
        cache_dir: str | None = None,
    ):
        if phase not in (1, 2, 3):
            raise ValueError(f"dschat: phase must be 1, 2 or 3, got {phase}")
        tokenizer = util.tokenizer
        tok = BatchTokenizer(tokenizer)
        eot = end_of_conversation_token if end_of_conversation_token is not None else tokenizer.eos_token
        if eot is None:
            raise ValueError("dschat: the tokenizer has no EOS token; pass end_of_conversation_token")
        raws, per_source = [], []
        for name, path in _source_list(sources):
            raw = get_raw_dataset(name, path, seed=util.seed, cache_dir=cache_dir)
            rows = raw.part_rows(part)
            keep = phase_indices(len(rows), data_split, phase, util.seed, cache_dir)
            raws.append(raw)
            per_source.append([rows[i] for i in sorted(keep)])
        sizes = [len(r) for r in per_source]
        if any(n == 0 for n in sizes):
            empty = [raws[j].dataset_name for j, n in enumerate(sizes) if n == 0]
            raise ValueError(
                f"dschat: phase {phase} of {part} gets no rows from {empty} (data_split {data_split!r})"
            )
        blended = blend_indices(sizes, weights, util.seed, total)
        owned = shard_indices(len(blended), util.dp_rank, util.world_size, util.seed)
        items = []
        for k in owned:
            src, item, rep = blended[k]
            row, where, index = per_source[src][item]
            id_ = f"{raws[src].dataset_name}:{part}:{index}" + (f"#{rep}" if rep else "")
            items.append(({"raw": raws[src], "row": row}, where, id_))

        def fit(ids: list[int]) -> list[int]:
            if len(ids) <= max_seq_len:
                return ids
            if not truncate:
                raise Skip(f"longer than max_seq_len={max_seq_len}")
            return ids[:max_seq_len]

        def texts(item) -> list[tuple[str, bool]]:
            """What the item's phase tokenizes, as (text, add_special_tokens); Skip when missing."""
            raw, row = item["raw"], item["row"]
            if phase == 1 and loss_on_prompt:
                text = raw.get_prompt_and_chosen(row)
                if text is None:
                    raise Skip("no prompt or chosen text")
                return [(text + eot, True)]
            if phase == 1:
                prompt, chosen = raw.get_prompt(row), raw.get_chosen(row)
                if prompt is None or chosen is None:
                    raise Skip("no prompt or chosen text")
                return [(prompt, True), (chosen + eot, False)]
            if phase == 2:
                chosen, rejected = raw.get_prompt_and_chosen(row), raw.get_prompt_and_rejected(row)
                if chosen is None or rejected is None:
                    raise Skip("no chosen or rejected text")
                return [(chosen + eot, True), (rejected + eot, True)]
            prompt = raw.get_prompt(row)
            if prompt is None:
                raise Skip("no prompt text")
            return [(prompt, True)]

        def build(item, where, id_, meta, dropped):
            ids = [tok(text, special) for text, special in texts(item)]
            if phase == 1 and loss_on_prompt:
                return sft_sample(id_, [], fit(ids[0]), loss_on_prompt=True)
            if phase == 1:
                p_ids, answer_ids = ids
                full = fit(p_ids + answer_ids)
                if len(full) <= len(p_ids):
                    raise Skip(f"prompt alone fills max_seq_len={max_seq_len}")
                return sft_sample(id_, full[: len(p_ids)], full[len(p_ids) :])
            if phase == 2:
                return paired_sample(id_, [(fit(ids[0]), fit(ids[1]))])
            if len(ids[0]) > max_seq_len:
                raise Skip(f"prompt longer than max_seq_len={max_seq_len}")
            return prompt_sample(id_, ids[0])

        super().__init__(f"dschat phase {phase}", util, items, (), self._wrap_errors(build), tok, texts)

    @staticmethod
    def _wrap_errors(build):
        """Name the row (file and line or row) in an adapter's field error."""

        def wrapped(item, where, id_, meta, dropped):
            try:
                return build(item, where, id_, meta, dropped)
            except DataError as e:
                raise DataError(f"{where}: {e}") from e

        return wrapped


register_dataset("dschat", DSChatDataset)
