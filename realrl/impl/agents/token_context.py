"""Token-in, token-out: the context an agent's completion continues.

A completion's context is not simply the template's rendering of the request's messages: the
model's earlier turns must stay the ids it sampled, which decoding and re-encoding need not give
back. The rule, for a request with messages ``M``: take the latest earlier completion ``c`` of this
agent (asked with ``M_c``, answered with text ``t_c``) such that ``M[len(M_c)]`` is an assistant
message whose content is ``t_c`` (whitespace at the ends aside), ``H`` = render(``M[:len(M_c) + 1]``)
starts with render(``M_c``) and render(``M``) starts with ``H``. Then the context is ``c``'s context
+ ``c``'s sampled ids + what ``H`` holds after the assistant turn's end-of-turn token (the
template's separator; the end-of-turn token too when ``c`` was cut before EOS) + render(``M``) after
``H``. With no such ``c`` the context is render(``M``): the conversation was restarted or edited,
and the completions it left behind are dropped from the trajectory (counted in
``agent/unchained_completions``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from realrl.api.core.chat_turns import PLAIN_CHAT_TEMPLATE
from realrl.impl.agents.endpoint import RequestError


@dataclasses.dataclass
class Completion:
    """One completion an agent was answered with."""

    messages: list[dict[str, Any]]  # the request's messages
    rendering: list[int]  # the template's rendering of them, generation prompt included
    context: list[int]  # what the model continued (earlier turns as sampled)
    tokens: list[int]
    logprobs: list[float]
    no_eos: bool
    text: str  # the content the agent was answered with


def render_messages(
    tokenizer: Any, messages: list[dict[str, Any]], tools: Any, generation_prompt: bool
) -> list[int]:
    """The chat template's ids of ``messages`` (the plain template where the tokenizer has none);
    a template that cannot render them raises ``RequestError``, which the agent sees."""
    kwargs = {"tools": tools} if tools else {}
    try:
        ids = tokenizer.apply_chat_template(
            messages,
            add_generation_prompt=generation_prompt,
            tokenize=True,
            return_dict=False,
            chat_template=tokenizer.chat_template or PLAIN_CHAT_TEMPLATE,
            **kwargs,
        )
    except Exception as e:  # noqa: BLE001 - templates raise what they like; the agent sees why
        raise RequestError(f"the chat template cannot render these messages: {type(e).__name__}: {e}") from e
    if isinstance(ids, Mapping):
        ids = ids["input_ids"]
    return [int(i) for i in ids]


def chained_context(
    tokenizer: Any,
    completions: list[Completion],
    messages: list[dict[str, Any]],
    tools: Any,
    rendering: list[int],
) -> list[int]:
    """The module docstring's rule: the context of a request for ``messages`` (rendered as
    ``rendering``) after the agent's earlier ``completions``."""
    eos = getattr(tokenizer, "eos_token_id", None)
    for c in reversed(completions):
        n = len(c.messages)
        if len(messages) <= n or messages[n].get("role") != "assistant":
            continue
        if (messages[n].get("content") or "").strip() != c.text.strip():
            continue
        try:
            history = render_messages(tokenizer, messages[: n + 1], tools, generation_prompt=False)
        except RequestError:
            continue
        if history[: len(c.rendering)] != c.rendering or rendering[: len(history)] != history:
            continue
        turn = history[len(c.rendering) :]
        ends = {eos} | ({c.tokens[-1]} if c.tokens and not c.no_eos else set())
        end = next((i for i, t in enumerate(turn) if t in ends), None)
        after = [] if end is None else turn[end + (0 if c.no_eos else 1) :]
        return c.context + c.tokens + after + rendering[len(history) :]
    return rendering
