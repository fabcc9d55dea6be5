"""``prompt_answer``: supervised fine-tuning data, prompt + answer + EOS (DeepSpeed-Chat's phase 1),
or prompt + a multi-turn trajectory whose tool turns are not trained on."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from realrl.api.core.chat_turns import observation_ids
from realrl.api.core.data_api import DatasetUtility, register_dataset
from realrl.impl.dataset.base import RowDataset, Skip
from realrl.impl.dataset.errors import DataError, get_field
from realrl.impl.dataset.samples import sft_sample
from realrl.impl.dataset.sources import DataSource
from realrl.impl.dataset.tokenize import (
    BatchTokenizer,
    check_messages,
    eos_token_id,
    is_conversational,
    to_ids,
)

TURN_ROLES = ("assistant", "tool", "user")  # a trajectory's turns (without a chat template)


class PromptAnswerDataset(RowDataset):
    """Each item: ``packed_input_ids`` = prompt + answer + EOS and ``prompt_mask``.

    Prompt and answer are tokenized separately and concatenated, so ``prompt_mask`` marks exactly
    the prompt's tokens. A text answer gets EOS appended unless it already ends with it; a chat
    answer (messages) is the chat template's continuation of the prompt.

    With a tokenizer that has no chat template, an answer of messages is a multi-turn trajectory
    (``{"role": "assistant" | "tool" | "user", "content": text}`` turns, after a text prompt): each
    assistant turn is its text's tokens + EOS, trained on; each tool or user turn is
    ``chat_turns.observation_ids`` of its text, marked like the prompt (no loss). These are the
    tokens a multi-turn rollout (``multi_turn.roll_out``) gives the same trajectory, so a policy
    fine-tuned on a teacher's trajectories sees observations as it will during RL, and never learns
    to write them.

    The loss is on the answer only by default; ``loss_on_prompt=True`` puts it on the prompt too, as
    DeepSpeed-Chat's phase 1 (``prompt_mask`` then is 0 on the prompt; a trajectory's tool turns
    stay masked: the model never writes them). Sequences over ``max_length`` are left out and
    counted, or cut to ``max_length`` tokens with ``truncate=True``.
    """

    dataset_name = "prompt_answer"

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
        self.eos = eos_token_id(util.tokenizer)
        self.turns_without_template = getattr(util.tokenizer, "chat_template", None) is None
        self.prompt_key = prompt_key
        self.answer_key = answer_key
        self.max_length = max_length
        self.truncate = truncate
        self.loss_on_prompt = loss_on_prompt
        super().__init__(util, dataset_path, dataset_builder, split, id_key, metadata_keys)

    def row_texts(self, row):
        prompt, answer = row.get(self.prompt_key), row.get(self.answer_key)
        if isinstance(prompt, str):
            yield prompt, True
        if isinstance(answer, str):
            yield answer, False
        elif self.turns_without_template and is_conversational(answer):
            yield from ((m["content"], False) for m in answer if _is_assistant_text(m))

    def build_row(self, row, where, id_, meta, dropped):
        prompt_key, answer_key, max_length, tok = self.prompt_key, self.answer_key, self.max_length, self.tok
        prompt = get_field(row, prompt_key, (str, list), where)
        answer = get_field(row, answer_key, (str, list), where)
        prompt_ids = to_ids(tok, prompt, prompt_key, where, add_generation_prompt=True)
        answer_mask = None  # 1 on the answer's tokens that are not trained on
        if self.turns_without_template and is_conversational(answer):
            answer_ids, answer_mask = trajectory_ids(tok, answer, self.eos, answer_key, where)
        elif is_conversational(answer):
            if not is_conversational(prompt):
                raise DataError(f"{where}: field {answer_key!r} is chat messages but {prompt_key!r} is not")
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
            if not answer_ids or answer_ids[-1] != self.eos:
                answer_ids.append(self.eos)
        if max_length is not None and len(prompt_ids) + len(answer_ids) > max_length:
            if not self.truncate:
                raise Skip(f"longer than max_length={max_length}")
            if len(prompt_ids) >= max_length:
                raise Skip(f"prompt alone fills max_length={max_length}")
            answer_ids = answer_ids[: max_length - len(prompt_ids)]
            answer_mask = None if answer_mask is None else answer_mask[: len(answer_ids)]
        return sft_sample(id_, prompt_ids, answer_ids, self.loss_on_prompt, meta, answer_mask)


def _is_assistant_text(message: object) -> bool:
    return (
        isinstance(message, dict)
        and message.get("role") == "assistant"
        and isinstance(message.get("content"), str)
    )


def trajectory_ids(
    tok: BatchTokenizer, turns: list[dict], eos: int, name: str, where: str
) -> tuple[list[int], list[bool]]:
    """A multi-turn answer's token ids, and True on the tokens not trained on (tool and user
    turns), for a tokenizer without a chat template (see ``PromptAnswerDataset``)."""
    check_messages(turns, name, where)
    ids: list[int] = []
    mask: list[bool] = []
    for j, m in enumerate(turns):
        role, content = m["role"], m["content"]
        if role not in TURN_ROLES:
            raise DataError(
                f"{where}: field {name!r}[{j}] has role {role!r}; a multi-turn answer's turns are "
                f"{' / '.join(TURN_ROLES)} (this tokenizer has no chat template)"
            )
        if not isinstance(content, str):
            raise DataError(
                f"{where}: field {name!r}[{j}] content must be text, got {type(content).__name__}"
            )
        if role == "assistant":
            turn = tok(content, add_special_tokens=False) + [eos]
        else:
            turn = observation_ids(tok.tokenizer, content, role)
        ids += turn
        mask += [role != "assistant"] * len(turn)
    if all(mask):
        raise DataError(f"{where}: field {name!r} has no assistant turn: nothing to train on")
    return ids, mask


register_dataset(PromptAnswerDataset.dataset_name, PromptAnswerDataset)
