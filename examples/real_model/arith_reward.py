"""A temporary reward plugin for the arithmetic prompts of ``make_arith_prompts.py`` (until the
built-in ``reward_fn=math_answer`` with ``dataset.metadata_keys=[answer]`` is wired in):

    python -m realrl.apps.quickstart grpo actor.path=./smollm2-135m-instruct \\
        dataset.path=./arith/rl_train.jsonl reward_fn=examples/real_model/arith_reward.py:arith_reward

1.0 when the completion's final answer (the number after the last ``####``, else its last
number) equals the reference, else 0.0. The reference is the row's ``answer`` field when the
dataset passes it (``dataset.metadata_keys=[answer]``), else it is worked out again from the
question in the prompt ("What is 23 + 58? ...").
"""

from __future__ import annotations

import re

_QUESTION = re.compile(r"What is (-?\d+) ([-+*]) (-?\d+)\?")
_FINAL = re.compile(r"####\s*(-?[\d,]+)")
_NUMBER = re.compile(r"-?\d[\d,]*")
_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


def _as_int(text: str) -> int | None:
    try:
        return int(text.replace(",", ""))
    except ValueError:
        return None


def final_answer(completion: str) -> int | None:
    marked = _FINAL.findall(completion)
    if marked:
        return _as_int(marked[-1])
    numbers = _NUMBER.findall(completion)
    return _as_int(numbers[-1]) if numbers else None


def reference_from_prompt(prompt: str) -> int | None:
    found = _QUESTION.findall(prompt)
    if not found:
        return None
    a, op, b = found[-1]
    return _OPS[op](int(a), int(b))


def arith_reward(prompts: list[str], completions: list[str], **metadata) -> list[float]:
    answers = metadata.get("answer")
    scores = []
    for i, (prompt, completion) in enumerate(zip(prompts, completions)):
        ref = _as_int(str(answers[i])) if answers is not None else reference_from_prompt(prompt)
        if ref is None:
            raise ValueError(f"no reference answer for prompt {prompt[-80:]!r}")
        scores.append(1.0 if final_answer(completion) == ref else 0.0)
    return scores
