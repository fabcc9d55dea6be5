"""How an environment's observation becomes tokens between two of the model's turns.

A multi-turn trajectory is trained token-in, token-out: the model's turns are kept as the ids it
sampled, and only what the environment adds is tokenized, once, by ``observation_ids``. The same
function serves rollouts and supervised multi-turn data, so a policy fine-tuned on a teacher's
trajectories sees observations exactly as it will during RL.

A model's turn ends with the tokenizer's EOS (a chat model's end-of-turn token). With a chat
template, the observation is the template's rendering of a ``tool`` message (``user`` when the
template refuses that role) from just after that EOS up to the next assistant turn's header, so the
trajectory reads as the template would have rendered the whole conversation. Without one it is the
observation's own text.
"""

from __future__ import annotations

from typing import Any

# how a conversation renders for a tokenizer without a chat template (a toy or base model's): the
# messages' texts back to back, each assistant turn ended by EOS, no generation prompt; the same
# tokens a multi-turn trajectory with an environment has, observations as their own text
PLAIN_CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['content'] }}{% if m['role'] == 'assistant' %}{{ eos_token }}{% endif %}"
    "{% endfor %}"
)
PROBE_USER = "?"  # the messages the template is rendered around: their content does not matter
PROBE_ASSISTANT = "!"


def observation_ids(tokenizer: Any, text: str, role: str = "tool") -> list[int]:
    """Token ids of ``text`` appended after a model's turn (which ended with EOS)."""
    if getattr(tokenizer, "chat_template", None) is None:
        return list(tokenizer.encode(text, add_special_tokens=False))
    return list(tokenizer.encode(observation_text(tokenizer, text, role), add_special_tokens=False))


def observation_text(tokenizer: Any, text: str, role: str = "tool") -> str:
    """The chat template's text between the end of an assistant turn and the next one's content."""
    history = [{"role": "user", "content": PROBE_USER}, {"role": "assistant", "content": PROBE_ASSISTANT}]
    before = tokenizer.apply_chat_template(history, tokenize=False)
    after = None
    for r in dict.fromkeys((role, "user")):  # a template without a tool role gets a user turn
        try:
            after = tokenizer.apply_chat_template(
                history + [{"role": r, "content": text}], tokenize=False, add_generation_prompt=True
            )
            break
        except Exception:  # noqa: BLE001 - templates raise what they like for a role they refuse
            continue
    if after is None:
        raise ValueError(
            f"the chat template renders neither a {role!r} nor a 'user' turn after an assistant's"
        )
    # the assistant turn ends at its EOS: what the template writes after it belongs to the observation
    eos = getattr(tokenizer, "eos_token", None) or ""
    end = before.rfind(eos, before.rfind(PROBE_ASSISTANT)) if eos else -1
    cut = end + len(eos) if end >= 0 else len(before)
    if not after.startswith(before[:cut]):
        raise ValueError("the chat template does not render a conversation as a prefix of its continuation")
    return after[cut:]
