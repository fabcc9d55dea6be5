"""``env=calc``: a calculator tool for the embedded multi-step arithmetic task (``task=calc``).

The syntax is made for a word-level toy tokenizer (one token per digit, operator and marker): a
model turn is either a tool call, ``calc 37*12`` (one binary operation on integers), answered with
the result, ``=444``, or the final answer, ``####449``. One operation per call, so a problem of
several operations needs several calls in an order that respects precedence: the task teaches
tool use (decompose, call, read the result back), not mental arithmetic. Anything else, such as a
second operator, a missing operand or free text, is answered ``=err`` and the model may try again.

The reward is 1 for a right final answer and 0 otherwise, with no format term: the SFT policy
already writes the format, and a bonus for well-formed calls would reward calls that lead
nowhere (GRPO compares answers of one prompt, where only correctness should separate them).

The environment keeps its trajectory's calls (``calls``) so that an evaluation can count tool
use without parsing the text a second time.
"""

from __future__ import annotations

import dataclasses
import re

from realrl.api.core.env_api import register_env

CALL = "calc"  # a tool call's marker: ``calc <a><op><b>``
ANSWER_MARKER = "####"  # the final answer's marker (GSM8K's): ``####<n>``
ERROR = "err"
RESULT = "="  # a tool result: ``=<n>``
ERROR_TEXT = f"{RESULT}{ERROR}"  # what a malformed turn gets back
OPERATORS = ("+", "-", "*")
MAX_DIGITS = 6  # longer operands are malformed calls (keeps an observation short)

_NUMBER = rf"-?\d{{1,{MAX_DIGITS}}}"
_CALL_RE = re.compile(rf"{CALL}\s*({_NUMBER})\s*([+\-*])\s*({_NUMBER})")
_ANSWER_RE = re.compile(rf"{ANSWER_MARKER}\s*(-?\d+)")


def call_text(a: int, op: str, b: int) -> str:
    """A tool call as the model writes it (EOS follows)."""
    return f"{CALL} {a}{op}{b}"


def result_text(value: int) -> str:
    """The tool's answer to a call (appended after the model's turn)."""
    return f"{RESULT}{value}"


def answer_text(value: int) -> str:
    """A final answer as the model writes it (EOS follows)."""
    return f"{ANSWER_MARKER}{value}"


def apply(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b if op == "-" else a * b


def parse_call(text: str) -> tuple[int, str, int] | None:
    """``(a, op, b)`` of a well-formed tool call (spaces anywhere), else None."""
    m = _CALL_RE.fullmatch(text.strip())
    return None if m is None else (int(m.group(1)), m.group(2), int(m.group(3)))


def parse_answer(text: str) -> int | None:
    """The number of a final answer ``####<n>``; None when the text is not one."""
    m = _ANSWER_RE.fullmatch(text.strip())
    return None if m is None else int(m.group(1))


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """One model turn that was not a final answer: a call (``args``) or a malformed turn (None)."""

    text: str
    args: tuple[int, str, int] | None

    @property
    def ok(self) -> bool:
        return self.args is not None


class CalculatorEnv:
    """One trajectory: tool calls until a final answer (``done``), scored against ``answer``."""

    def __init__(self, prompt: str, answer: str | int, **_: object):
        self.prompt = prompt
        self.answer = int(answer)
        self.calls: list[ToolCall] = []
        self.final: int | None = None  # the final answer, once given
        self.answered = False  # a turn began with the answer marker (right, wrong or malformed)

    def step(self, completion: str) -> tuple[str | None, float, bool]:
        text = completion.strip()
        if text.startswith(ANSWER_MARKER):
            self.answered, self.final = True, parse_answer(text)
            return None, float(self.final == self.answer), True
        args = parse_call(text)
        self.calls.append(ToolCall(text, args))
        if args is None:
            return ERROR_TEXT, 0.0, False
        return result_text(apply(*args)), 0.0, False


register_env("calc", CalculatorEnv)
