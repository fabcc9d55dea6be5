"""Text or chat messages -> token ids, the way TRL and DeepSpeed-Chat do it."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from realrl.impl.dataset.errors import DataError, check_token_ids

BATCH_ROWS = 256  # rows whose texts are tokenized in one batch call (larger batches are no faster)


class BatchTokenizer:
    """``tokenizer(text, add_special_tokens=...)["input_ids"]`` with the texts of a chunk of rows
    tokenized ahead in one batch call (a fast tokenizer encodes a batch in Rust, on every core).

    A dataset lists the texts its next rows will need (``prefetch``), then builds each row asking
    for them one by one; a text that was not listed is tokenized alone, so a wrong or missing
    hint costs time, never different ids. Each call returns a fresh list the caller may change.
    """

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        # read once (a slow attribute in transformers 5); pre-tokenized data may come with no tokenizer
        self.eos_token: str | None = getattr(tokenizer, "eos_token", None)
        self._ids: dict[tuple[str, bool], list[int]] = {}

    def prefetch(self, texts: Iterable[tuple[str, bool]]) -> None:
        """Forget the previous chunk; tokenize these ``(text, add_special_tokens)`` in batches."""
        self._ids = {}
        pending: dict[bool, dict[str, None]] = {True: {}, False: {}}  # ordered, without repeats
        for text, special in texts:
            pending[special][text] = None
        for special, batch in pending.items():
            if batch:
                out = self.tokenizer(
                    list(batch),
                    add_special_tokens=special,
                    return_attention_mask=False,  # input_ids only: less to convert per text
                    return_token_type_ids=False,
                )["input_ids"]
                self._ids.update(zip([(t, special) for t in batch], out))

    def __call__(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = self._ids.get((text, add_special_tokens))
        if ids is None:
            return list(self.tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])
        return list(ids)


def is_conversational(value: Any) -> bool:
    """A list of ``{"role", "content"}`` messages (TRL's test: the first element has a role)."""
    return isinstance(value, list) and bool(value) and isinstance(value[0], dict) and "role" in value[0]


def check_messages(value: Any, name: str, where: str) -> list[dict]:
    for j, m in enumerate(value):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or "content" not in m:
            raise DataError(
                f"{where}: field {name!r}[{j}] must be a {{'role', 'content'}} message, got {m!r:.60}"
            )
    return value


def tokenize(tok: BatchTokenizer, value: str | list[dict], add_generation_prompt: bool = False) -> list[int]:
    """Plain text through ``tokenizer(text)`` (with its special tokens, as TRL), messages through
    the tokenizer's chat template (one row at a time)."""
    if isinstance(value, str):
        return tok(value)
    tokenizer = tok.tokenizer
    if getattr(tokenizer, "chat_template", None) is None:
        raise DataError("conversational rows need a tokenizer with a chat template; this one has none")
    try:
        out = tokenizer.apply_chat_template(
            value, tokenize=True, return_dict=True, add_generation_prompt=add_generation_prompt
        )
    except Exception as e:  # noqa: BLE001 - a template raises what it likes (jinja's TemplateError, ...)
        raise DataError(f"the chat template refused these messages: {type(e).__name__}: {e}") from e
    return list(out["input_ids"])


def eos_token_id(tokenizer: Any) -> int:
    if tokenizer.eos_token_id is None:
        raise ValueError("the tokenizer has no EOS token; set one (sequences must end with EOS)")
    return int(tokenizer.eos_token_id)


def to_ids(
    tok: BatchTokenizer, value: Any, name: str, where: str, add_generation_prompt: bool = False
) -> list[int]:
    """A field's token ids, whatever its form: text, chat messages, or already token ids."""
    if isinstance(value, str):
        return tok(value)
    if is_conversational(value):
        check_messages(value, name, where)
        try:
            return tokenize(tok, value, add_generation_prompt=add_generation_prompt)
        except DataError as e:
            raise DataError(f"{where}: field {name!r}: {e}") from e
    if (
        isinstance(value, list)
        and value
        and all(isinstance(x, int) and not isinstance(x, bool) for x in value)
    ):
        return check_token_ids(value, name, where)
    raise DataError(
        f"{where}: field {name!r} must be text, a list of chat messages or a list of token ids, "
        f"got {type(value).__name__} {value!r:.60}"
    )
