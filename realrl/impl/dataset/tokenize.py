"""Text or chat messages -> token ids, the way TRL and DeepSpeed-Chat do it."""

from __future__ import annotations

from typing import Any

from realrl.impl.dataset.errors import DataError, check_token_ids


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


def tokenize(tokenizer: Any, value: str | list[dict], add_generation_prompt: bool = False) -> list[int]:
    """Plain text through ``tokenizer(text)`` (with its special tokens, as TRL), messages through
    the tokenizer's chat template."""
    if isinstance(value, str):
        return list(tokenizer(value)["input_ids"])
    if getattr(tokenizer, "chat_template", None) is None:
        raise DataError("conversational rows need a tokenizer with a chat template; this one has none")
    out = tokenizer.apply_chat_template(
        value, tokenize=True, return_dict=True, add_generation_prompt=add_generation_prompt
    )
    return list(out["input_ids"])


def eos_token_id(tokenizer: Any) -> int:
    if tokenizer.eos_token_id is None:
        raise ValueError("the tokenizer has no EOS token; set one (sequences must end with EOS)")
    return int(tokenizer.eos_token_id)


def to_ids(
    tokenizer: Any, value: Any, name: str, where: str, add_generation_prompt: bool = False
) -> list[int]:
    """A field's token ids, whatever its form: text, chat messages, or already token ids."""
    if isinstance(value, str):
        return tokenize(tokenizer, value)
    if is_conversational(value):
        check_messages(value, name, where)
        try:
            return tokenize(tokenizer, value, add_generation_prompt=add_generation_prompt)
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
