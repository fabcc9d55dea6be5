"""The calculator task: multi-step arithmetic that a tiny model solves only with a tool.

Problems are expressions of two or three operations on two-digit numbers (``"37*12+5=?"``,
values up to ``max_value``), beyond what a 1M-parameter model computes in its head. The
calculator (``realrl.impl.envs.calculator``, ``env=calc``) does one operation per call: the
model writes ``calc 37*12`` + EOS, the environment answers ``=444``, the model calls
``calc 444+5``, reads ``=449`` and writes ``####449`` + EOS. One token per digit, operator and
marker, so reading a result back is copying tokens.

The supervised data are whole trajectories of a *teacher that uses the tool imperfectly*, each
slip tied to a feature of the problem so that a fine-tuned model learns it as a habit (it makes
it on most problems of that kind, greedy decoding included) while its samples are right often
enough for RL with the environment's correctness reward to unlearn it:

- on problems of ``+`` and ``-`` only, it skips the tool (``skip_rate``) and answers in its head,
  forgetting carries and borrows (the arithmetic task's mistake): right only when none is needed;
- where precedence matters (``5+37*12``), it calls the tool left to right (``precedence_slip_rate``),
  on the wrong sub-expression;
- when it copies a result of three or more digits (into the next call or the final answer), it
  swaps the last two digits (``copy_slip_rate``, per copy).

``build_calc_task`` writes, under one folder:

- ``tokenizer/``: a Hugging Face tokenizer folder (``AutoTokenizer`` loads it offline);
- ``sft_train.jsonl`` / ``sft_valid.jsonl``: ``{"prompt": "37*12+5=?", "answer": [turns]}``, the
  teacher's trajectories as ``{"role": "assistant" | "tool", "content": ...}`` turns (the
  ``prompt_answer`` dataset trains on the assistant turns only);
- ``rl_train.jsonl`` / ``rl_valid.jsonl``: ``{"prompt": "37*12+5=?", "answer": "449"}``, the true
  answers (the ``prompt`` dataset's format; pass ``dataset.metadata_keys=[answer]``);
- ``manifest.json``: the config, its fingerprint, counts, the teacher's accuracy and slip shares.

Validation problems never appear in the training files.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re

import numpy as np

from realrl.impl.dataset.toy.arith import ARITH_DECODER, teacher_mistake
from realrl.impl.dataset.toy.model_config import tiny_decoder_config
from realrl.impl.dataset.toy.task_files import TaskFiles, build_once, task_paths
from realrl.impl.dataset.toy.word_tokenizer import BOS, EOS, PAD, UNK, save_word_level_tokenizer
from realrl.impl.envs.calculator import (
    ANSWER_MARKER,
    CALL,
    ERROR,
    OPERATORS,
    answer_text,
    apply,
    call_text,
    result_text,
)

DIGITS = tuple("0123456789")
SYMBOLS = ("+", "-", "*", "=", "?", ANSWER_MARKER, CALL, ERROR)
TOKENS = (PAD, BOS, EOS, UNK) + DIGITS + SYMBOLS
_PROMPT_RE = re.compile(r"\s*(\d+(?:\s*[+\-*]\s*\d+)+)\s*=\s*\?\s*")


@dataclasses.dataclass
class CalcTaskConfig:
    seed: int = 1
    n_train: int = 20000  # RL training prompts
    n_valid: int = 500  # held-out problems (both sft_valid and rl_valid)
    n_sft_train: int = 10000  # teacher trajectories
    n_ops: tuple[int, ...] = (2, 3)  # operations per problem, drawn uniformly from these
    min_operand: int = 2
    max_operand: int = 99
    max_value: int = 9999  # every value on the way to the true answer stays in 0..max_value
    skip_rate: float = 0.7  # P(the teacher answers a +/- problem in its head)
    precedence_slip_rate: float = 0.7  # P(left to right where precedence matters)
    copy_slip_rate: float = 0.3  # P(two digits swapped) per copy of a result of >= 3 digits

    def __post_init__(self) -> None:
        self.n_ops = tuple(int(n) for n in self.n_ops)
        if not self.n_ops or any(n not in (2, 3) for n in self.n_ops):
            raise ValueError(f"CalcTaskConfig.n_ops must hold 2 and/or 3, got {self.n_ops}")
        for name in ("skip_rate", "precedence_slip_rate", "copy_slip_rate"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"CalcTaskConfig.{name} must be in [0, 1], got {getattr(self, name)}")
        if not 0 <= self.min_operand < self.max_operand <= 999:
            raise ValueError("CalcTaskConfig: need 0 <= min_operand < max_operand <= 999")
        if self.max_value < self.max_operand:
            raise ValueError("CalcTaskConfig.max_value must be >= max_operand")
        for name in ("n_train", "n_valid", "n_sft_train"):
            if getattr(self, name) < 1:
                raise ValueError(f"CalcTaskConfig.{name} must be >= 1, got {getattr(self, name)}")

    def fingerprint(self) -> str:
        blob = json.dumps({**dataclasses.asdict(self), "format": 1}, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


# ----------------------------------------------------------------------------- problems


@dataclasses.dataclass(frozen=True)
class Problem:
    nums: tuple[int, ...]
    ops: tuple[str, ...]

    def text(self) -> str:
        out = str(self.nums[0])
        for op, n in zip(self.ops, self.nums[1:]):
            out += f"{op}{n}"
        return out + "=?"

    @property
    def value(self) -> int:
        return evaluate(self.nums, self.ops)


def parse_prompt(text: str) -> Problem | None:
    """The problem a prompt states (``"37*12+5=?"``), or None."""
    m = _PROMPT_RE.fullmatch(text)
    if m is None:
        return None
    parts = re.findall(r"\d+|[+\-*]", m.group(1))
    return Problem(tuple(int(p) for p in parts[::2]), tuple(parts[1::2]))


def evaluate(nums: tuple[int, ...] | list[int], ops: tuple[str, ...] | list[str]) -> int:
    """The value with the usual precedence: products first, then left to right."""
    nums, ops = list(nums), list(ops)
    while ops:
        i = _next_step(ops, precedence=True)
        nums[i : i + 2] = [apply(nums[i], ops[i], nums[i + 1])]
        del ops[i]
    return nums[0]


def _next_step(ops: list[str], precedence: bool) -> int:
    """Where the next operation is: the leftmost product first with precedence, else the leftmost."""
    return ops.index("*") if precedence and "*" in ops else 0


def _reduce(nums: list[int], ops: list[str], i: int, value: int) -> tuple[list[int], list[str]]:
    return nums[:i] + [value] + nums[i + 2 :], ops[:i] + ops[i + 1 :]


def precedence_matters(p: Problem) -> bool:
    """Whether evaluating left to right gives another value (the teacher's precedence slip)."""
    nums, ops = list(p.nums), list(p.ops)
    while ops:
        nums, ops = _reduce(nums, ops, 0, apply(nums[0], ops[0], nums[1]))
    return nums[0] != p.value


def additive(p: Problem) -> bool:
    """Only ``+`` and ``-``: the problems the teacher sometimes does in its head."""
    return "*" not in p.ops


def right_calls(p: Problem, calls: list[tuple[int, str, int] | None]) -> list[bool]:
    """For each tool call in order, whether it computes a right sub-expression: an operation of
    the problem as reduced by the right calls before it, whose result keeps the problem's value
    (``None``, a malformed call, is never right). A call after a wrong one is judged against the
    problem as the right calls left it."""
    nums, ops, target = list(p.nums), list(p.ops), p.value
    out = []
    for call in calls:
        ok = False
        if call is not None:
            for i in range(len(ops)):
                if (nums[i], ops[i], nums[i + 1]) == call:
                    n2, o2 = _reduce(nums, ops, i, apply(*call))
                    if evaluate(n2, o2) == target:
                        nums, ops, ok = n2, o2, True
                        break
        out.append(ok)
    return out


def _valid(p: Problem, max_value: int) -> bool:
    """Every value on the way to the answer (products first) within 0..max_value."""
    nums, ops = list(p.nums), list(p.ops)
    while ops:
        i = _next_step(ops, precedence=True)
        value = apply(nums[i], ops[i], nums[i + 1])
        if not 0 <= value <= max_value:
            return False
        nums, ops = _reduce(nums, ops, i, value)
    return True


def _draw_problems(cfg: CalcTaskConfig, n: int, rng: np.random.Generator, avoid: set[str]) -> list[Problem]:
    out: list[Problem] = []
    while len(out) < n:
        k = cfg.n_ops[int(rng.integers(len(cfg.n_ops)))]
        ops = tuple(OPERATORS[int(i)] for i in rng.integers(len(OPERATORS), size=k))
        nums = tuple(int(x) for x in rng.integers(cfg.min_operand, cfg.max_operand + 1, size=k + 1))
        p = Problem(nums, ops)
        if _valid(p, cfg.max_value) and p.text() not in avoid:
            out.append(p)
    return out


# ----------------------------------------------------------------------------- the teacher


def copy_slip(value: int) -> int:
    """The teacher's copying mistake: the last two digits swapped (the value itself when they
    are equal or it has fewer than three digits)."""
    s = str(abs(value))
    if len(s) < 3:
        return value
    swapped = int(s[:-2] + s[-1] + s[-2])
    return -swapped if value < 0 else swapped


def mental_value(p: Problem) -> int:
    """A +/- problem done in the head, left to right, forgetting every carry and borrow."""
    value = p.nums[0]
    for op, n in zip(p.ops, p.nums[1:]):
        value = teacher_mistake(value, op, n)
    return value


@dataclasses.dataclass(frozen=True)
class TeacherTrajectory:
    turns: list[dict[str, str]]
    value: int  # the final answer
    slips: tuple[str, ...]  # which slips it made: "skip", "precedence", "copy"


def teacher_trajectory(p: Problem, cfg: CalcTaskConfig, rng: np.random.Generator) -> TeacherTrajectory:
    """The teacher's turns on ``p`` (``{"role", "content"}``; the tool's turns are what
    ``CalculatorEnv`` answers)."""
    u_skip, u_prec = rng.random(2)
    copies = rng.random(len(p.ops))  # one draw per result copied (the last: into the answer)
    if additive(p) and u_skip < cfg.skip_rate:
        value = mental_value(p)
        return TeacherTrajectory([_assistant(answer_text(value))], value, ("skip",))
    slips = []
    precedence = not (precedence_matters(p) and u_prec < cfg.precedence_slip_rate)
    if not precedence:
        slips.append("precedence")
    nums, ops, turns = list(p.nums), list(p.ops), []
    for u in copies:
        i = _next_step(ops, precedence)
        result = apply(nums[i], ops[i], nums[i + 1])
        turns += [_assistant(call_text(nums[i], ops[i], nums[i + 1])), _tool(result_text(result))]
        copied = copy_slip(result) if u < cfg.copy_slip_rate else result
        if copied != result:
            slips.append("copy")
        nums, ops = _reduce(nums, ops, i, copied)
    turns.append(_assistant(answer_text(nums[0])))
    return TeacherTrajectory(turns, nums[0], tuple(dict.fromkeys(slips)))


def _assistant(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": text}


def _tool(text: str) -> dict[str, str]:
    return {"role": "tool", "content": text}


def _teacher_rows(problems: list[Problem], cfg: CalcTaskConfig, rng: np.random.Generator):
    rows, trajs = [], []
    for p in problems:
        t = teacher_trajectory(p, cfg, rng)
        rows.append({"prompt": p.text(), "answer": t.turns})
        trajs.append(t)
    return rows, trajs


def _teacher_stats(problems: list[Problem], trajs: list[TeacherTrajectory]) -> dict[str, float]:
    n = max(1, len(problems))
    return {
        "teacher_accuracy": sum(t.value == p.value for p, t in zip(problems, trajs)) / n,
        "teacher_tool_use": sum(len(t.turns) > 1 for t in trajs) / n,
        **{
            f"teacher_{s}_slips": sum(s in t.slips for t in trajs) / n for s in ("skip", "precedence", "copy")
        },
    }


# ----------------------------------------------------------------------------- files


def save_calc_tokenizer(folder: str) -> str:
    """A tokenizer folder: one token per digit, operator, ``=``, ``?``, ``####``, ``calc``, ``err``.

    Text is split at whitespace and then into those symbols; decoding joins tokens with no space
    except after ``calc``, so ``decode(encode(x)) == x`` for text written as this task writes it.
    """
    from tokenizers import Regex, decoders, pre_tokenizers

    split = pre_tokenizers.Sequence(
        [
            pre_tokenizers.WhitespaceSplit(),
            pre_tokenizers.Split(Regex(rf"\d|{ANSWER_MARKER}|{CALL}|{ERROR}|[+\-*=?]"), behavior="isolated"),
        ]
    )
    decoder = decoders.Sequence([decoders.Replace(CALL, CALL + " "), decoders.Fuse()])
    return save_word_level_tokenizer(folder, TOKENS, split, decoder)


calc_paths = task_paths  # where build_calc_task puts each file


def build_calc_task(out_dir: str, cfg: CalcTaskConfig | None = None) -> dict[str, str]:
    """Write the task under ``out_dir`` (reused when already built with the same config); the
    same seed gives the same files. Returns ``calc_paths(out_dir)``."""
    cfg = cfg or CalcTaskConfig()

    def make() -> TaskFiles:
        rng = np.random.default_rng(cfg.seed)
        valid = _draw_problems(cfg, cfg.n_valid, rng, set())
        held_out = {p.text() for p in valid}
        if len(held_out) < len(valid):  # a repeated validation problem: keep one of each
            valid = list({p.text(): p for p in valid}.values())
        sft_problems = _draw_problems(cfg, cfg.n_sft_train, rng, held_out)
        sft_train, sft_trajs = _teacher_rows(sft_problems, cfg, rng)
        sft_valid, _ = _teacher_rows(valid, cfg, rng)
        rl_train = _rl_rows(_draw_problems(cfg, cfg.n_train, rng, held_out))
        rl_valid = _rl_rows(valid)
        rows = {"sft_train": sft_train, "sft_valid": sft_valid, "rl_train": rl_train, "rl_valid": rl_valid}
        facts = {
            **_teacher_stats(sft_problems, sft_trajs),
            "valid_additive_fraction": sum(additive(p) for p in valid) / len(valid),
            "valid_precedence_fraction": sum(precedence_matters(p) for p in valid) / len(valid),
        }
        return TaskFiles(rows, save_calc_tokenizer, facts)

    return build_once(out_dir, cfg, make)


def _rl_rows(problems: list[Problem]) -> list[dict]:
    return [{"prompt": p.text(), "answer": str(p.value)} for p in problems]


def calc_model_config(n_positions: int = 96) -> dict:
    """The task's tiny llama-family decoder (the arithmetic task's: d=128, 4 layers, 4 heads),
    with room for a three-operation trajectory. A ``ReaLModelConfig`` field dict."""
    return tiny_decoder_config(ARITH_DECODER, TOKENS, n_positions)
