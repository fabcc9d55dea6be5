"""``prompt_answer``: supervised fine-tuning data, prompt + answer + EOS (DeepSpeed-Chat's phase 1)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from realrl.api.core.data_api import DatasetUtility, register_dataset
from realrl.impl.dataset.base import SampleListDataset, Skip, owned_rows
from realrl.impl.dataset.errors import DataError, get_field
from realrl.impl.dataset.samples import sft_sample
from realrl.impl.dataset.sources import DataSource
from realrl.impl.dataset.tokenize import BatchTokenizer, eos_token_id, is_conversational, to_ids


class PromptAnswerDataset(SampleListDataset):
    """Each item: ``packed_input_ids`` = prompt + answer + EOS and ``prompt_mask``.

    Prompt and answer are tokenized separately and concatenated, so ``prompt_mask`` marks exactly
    the prompt's tokens. A text answer gets EOS appended unless it already ends with it; a chat
    answer (messages) is the chat template's continuation of the prompt. The loss is on the answer
    only by default; ``loss_on_prompt=True`` puts it on every token, as DeepSpeed-Chat's phase 1
    (``prompt_mask`` then is all zeros). Sequences over ``max_length`` are left out and counted,
    or cut to ``max_length`` tokens with ``truncate=True``.
    """

    def __init__(
        self,
        util: DatasetUtility,
        dataset_path: DataSource | None = None,
        dataset_builder: Callable[[], Any] | None = None,
        split: str | None = None,
        prompt_key: str = "prompt",
        answer_key: str = "answer",
        max_length: int | None = None,
        truncate: bool = False,
        loss_on_prompt: bool = False,
        id_key: str | None = None,
        metadata_keys: Sequence[str] = (),
    ):
        tok = BatchTokenizer(util.tokenizer)
        eos = eos_token_id(util.tokenizer)

        def texts(row):
            prompt, answer = row.get(prompt_key), row.get(answer_key)
            if isinstance(prompt, str):
                yield prompt, True
            if isinstance(answer, str):
                yield answer, False

        def build(row, where, id_, meta, dropped):
            prompt = get_field(row, prompt_key, (str, list), where)
            answer = get_field(row, answer_key, (str, list), where)
            prompt_ids = to_ids(tok, prompt, prompt_key, where, add_generation_prompt=True)
            if is_conversational(answer):
                if not is_conversational(prompt):
                    raise DataError(
                        f"{where}: field {answer_key!r} is chat messages but {prompt_key!r} is not"
                    )
                full = to_ids(tok, prompt + answer, f"{prompt_key}+{answer_key}", where)
                if full[: len(prompt_ids)] != prompt_ids:
                    raise DataError(
                        f"{where}: the chat template does not render prompt {prompt_key!r} as a prefix "
                        "of prompt + answer; cannot mark the prompt tokens"
                    )
                answer_ids = full[len(prompt_ids) :]
            else:
                answer_ids = (
                    tok(answer, add_special_tokens=False)
                    if isinstance(answer, str)
                    else to_ids(tok, answer, answer_key, where)
                )
                if not answer_ids or answer_ids[-1] != eos:
                    answer_ids.append(eos)
            if max_length is not None and len(prompt_ids) + len(answer_ids) > max_length:
                if not truncate:
                    raise Skip(f"longer than max_length={max_length}")
                if len(prompt_ids) >= max_length:
                    raise Skip(f"prompt alone fills max_length={max_length}")
                answer_ids = answer_ids[: max_length - len(prompt_ids)]
            return sft_sample(id_, prompt_ids, answer_ids, loss_on_prompt, meta)

        rows = owned_rows("prompt_answer", util, dataset_path, dataset_builder, split, id_key)
        super().__init__("prompt_answer", util, rows, metadata_keys, build, tok, texts)


register_dataset("prompt_answer", PromptAnswerDataset)
