"""The arithmetic task: a verifiable toy task for GRPO with a rule-based checker.

Problems are small sums and differences (``"47+38=?"``) written one token per digit, so a tiny
model must learn to carry. The answer is ``"####85"``: GSM8K's answer marker, then the digits, then
EOS; ``math_answer`` reads it. The supervised data come from a *noisy teacher* that forgets to
carry (or to borrow) on a fraction ``teacher_error_rate`` of its rows, the typical mistake of a
learner: a model fine-tuned on them answers the problems that need no carry and, on those that
do, mostly makes the teacher's mistake, while its samples are right often enough for a
correctness reward (``math_answer`` against the true answer in the RL rows) to teach it to carry.

``build_arith_task`` writes, under one folder:

- ``tokenizer/``: a Hugging Face tokenizer folder (``AutoTokenizer`` loads it offline);
- ``sft_train.jsonl`` / ``sft_valid.jsonl``: ``{"prompt": "47+38=?", "answer": "####75"}``, the
  teacher's answers (the ``prompt_answer`` dataset's format);
- ``rl_train.jsonl`` / ``rl_valid.jsonl``: ``{"prompt": "47+38=?", "answer": "85"}``, the true
  answers (the ``prompt`` dataset's format; pass ``dataset.metadata_keys=[answer]``);
- ``manifest.json``: the config, its fingerprint, counts and the teacher's accuracy.

Validation problems never appear in the training files. ``ops=("+", "-", "*")`` adds the
multiplication table up to ``max_mul_operand`` (the teacher's mistake: one row too many); a held-out
product is a fact the model never saw, so its validation score measures recall more than skill.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

import numpy as np

from realrl.impl.dataset.toy.model_config import DecoderShape, tiny_decoder_config
from realrl.impl.dataset.toy.task_files import TaskFiles, build_once, task_paths
from realrl.impl.dataset.toy.word_tokenizer import BOS, EOS, PAD, UNK, save_word_level_tokenizer
from realrl.impl.rewards.math_answer import math_answer_reward

ANSWER_MARKER = "####"
DIGITS = tuple("0123456789")
SYMBOLS = ("+", "-", "*", "=", "?", ANSWER_MARKER)
TOKENS = (PAD, BOS, EOS, UNK) + DIGITS + SYMBOLS
ARITH_DECODER = DecoderShape(n_layers=4, hidden_dim=128, intermediate_dim=384)  # also the calc task's
OPS = ("+", "-", "*")
MAX_VALID_SHARE = 0.2  # of each pool of training problems


@dataclasses.dataclass
class ArithTaskConfig:
    seed: int = 1
    n_train: int = 20000  # RL training prompts (drawn with replacement from the training problems)
    n_valid: int = 500  # held-out problems (both sft_valid and rl_valid; fewer for a small pool)
    n_sft_train: int = 10000  # supervised rows from the noisy teacher
    ops: tuple[str, ...] = ("+", "-")
    max_operand: int = 99  # "+" and "-": operands 0..max_operand ("-": never below zero)
    max_mul_operand: int = 12  # "*": operands 0..max_mul_operand
    carry_fraction: float = 0.7  # share of problems that need a carry / borrow (train and valid)
    teacher_error_rate: float = 0.7  # P(the teacher forgets to carry / borrow) on a row

    def __post_init__(self) -> None:
        self.ops = tuple(self.ops)
        bad = [op for op in self.ops if op not in OPS]
        if not self.ops or bad:
            raise ValueError(f"ArithTaskConfig.ops must be a non-empty subset of {OPS}, got {self.ops}")
        for name in ("teacher_error_rate", "carry_fraction"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"ArithTaskConfig.{name} must be in [0, 1], got {getattr(self, name)}")
        if not 0 < self.max_operand <= 999 or not 0 < self.max_mul_operand <= 31:
            raise ValueError("ArithTaskConfig: max_operand must be in 1..999 and max_mul_operand in 1..31")
        for name in ("n_train", "n_valid", "n_sft_train"):
            if getattr(self, name) < 1:
                raise ValueError(f"ArithTaskConfig.{name} must be >= 1, got {getattr(self, name)}")

    def fingerprint(self) -> str:
        blob = json.dumps({**dataclasses.asdict(self), "format": 1}, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


# ----------------------------------------------------------------------------- problems and answers


def solve(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b if op == "-" else a * b


def _digits(n: int, width: int) -> list[int]:
    return [int(c) for c in str(n).zfill(width)]


def teacher_mistake(a: int, op: str, b: int) -> int:
    """The teacher's typical error: digit sums without carrying, digit differences without
    borrowing (the smaller digit taken from the larger), a product one row too many (a*(b+1)).
    Equals the true answer on problems that need no carry or borrow."""
    if op == "*":
        return a * (b + 1)
    width = max(len(str(a)), len(str(b)))
    da, db = _digits(a, width), _digits(b, width)
    if op == "+":
        out = [(x + y) % 10 for x, y in zip(da, db)]
        lead = 1 if da[0] + db[0] >= 10 else 0  # the leading column still writes its full sum
        return int(("1" if lead else "") + "".join(map(str, out)))
    return int("".join(str(abs(x - y)) for x, y in zip(da, db)))


def prompt_text(a: int, op: str, b: int) -> str:
    return f"{a}{op}{b}=?"


def completion_text(value: int) -> str:
    """What the model should write after the prompt (EOS follows)."""
    return f"{ANSWER_MARKER}{value}"


def _problems(op: str, cfg: ArithTaskConfig) -> list[tuple[int, str, int]]:
    hi = cfg.max_mul_operand if op == "*" else cfg.max_operand
    return [(a, op, b) for a in range(hi + 1) for b in range(hi + 1) if op != "-" or a >= b]


def needs_carry(a: int, op: str, b: int) -> bool:
    """Whether the teacher's mistake changes the answer (a carry, a borrow, a non-zero product)."""
    return teacher_mistake(a, op, b) != solve(a, op, b)


def _pools(cfg: ArithTaskConfig, rng: np.random.Generator) -> tuple[dict, list]:
    """Training pools per (operator, needs carry) and the validation problems, disjoint.

    Validation holds ``n_valid`` problems split evenly over the operators, a ``carry_fraction`` of
    each needing a carry; at most ``MAX_VALID_SHARE`` of any pool is held out (so a small pool, such
    as a multiplication table, keeps most of its problems for training)."""
    pools, valid = {}, []
    n_ops = len(cfg.ops)
    for k, op in enumerate(cfg.ops):
        n_op = cfg.n_valid // n_ops + (1 if k < cfg.n_valid % n_ops else 0)
        n_hard = int(round(n_op * cfg.carry_fraction))
        problems = _problems(op, cfg)
        for hard, n_want in ((True, n_hard), (False, n_op - n_hard)):
            pool = [p for p in problems if needs_carry(*p) == hard]
            order = rng.permutation(len(pool))
            n_held = min(n_want, int(len(pool) * MAX_VALID_SHARE))
            valid += [pool[i] for i in order[:n_held]]
            pools[op, hard] = [pool[i] for i in order[n_held:]]
    return pools, [valid[i] for i in rng.permutation(len(valid))]


def _draw(pools: dict, cfg: ArithTaskConfig, n: int, rng: np.random.Generator) -> list[tuple[int, str, int]]:
    """``n`` training problems: an operator uniformly, then a carry problem with probability
    ``carry_fraction`` (when the operator has both kinds), then a problem of that kind."""
    out = []
    for k, u, v in zip(rng.integers(len(cfg.ops), size=n), rng.random(n), rng.random(n)):
        op = cfg.ops[k]
        hard = bool(u < cfg.carry_fraction)
        pool = pools[op, hard] or pools[op, not hard]
        out.append(pool[int(v * len(pool))])
    return out


def _teacher_rows(problems, cfg: ArithTaskConfig, rng: np.random.Generator) -> tuple[list[dict], float]:
    rows, correct = [], 0
    for (a, op, b), u in zip(problems, rng.random(len(problems))):
        truth = solve(a, op, b)
        value = teacher_mistake(a, op, b) if u < cfg.teacher_error_rate else truth
        correct += value == truth
        rows.append({"prompt": prompt_text(a, op, b), "answer": completion_text(value)})
    return rows, correct / max(1, len(rows))


def _rl_rows(problems) -> list[dict]:
    return [{"prompt": prompt_text(a, op, b), "answer": str(solve(a, op, b))} for a, op, b in problems]


# ----------------------------------------------------------------------------- files


def save_arith_tokenizer(folder: str) -> str:
    """A ``PreTrainedTokenizerFast`` folder: one token per digit, operator, ``=``, ``?``, ``####``.

    Text is split at whitespace and then into those symbols, so ``"47+38=?"`` and
    ``"47 + 38 = ?"`` give the same tokens; decoding joins tokens with no spaces, so
    ``decode(encode(x)) == x`` for text written as this task writes it.
    """
    from tokenizers import Regex, decoders, pre_tokenizers

    split = pre_tokenizers.Sequence(
        [
            pre_tokenizers.WhitespaceSplit(),
            pre_tokenizers.Split(Regex(r"\d|####|[+\-*=?]"), behavior="isolated"),
        ]
    )
    return save_word_level_tokenizer(folder, TOKENS, split, decoders.Fuse())


arith_paths = task_paths  # where build_arith_task puts each file


def build_arith_task(out_dir: str, cfg: ArithTaskConfig | None = None) -> dict[str, str]:
    """Write the task under ``out_dir`` (reused when already built with the same config); the
    same seed gives the same files. Returns ``arith_paths(out_dir)``."""
    cfg = cfg or ArithTaskConfig()

    def make() -> TaskFiles:
        rng = np.random.default_rng(cfg.seed)
        pools, valid = _pools(cfg, rng)
        sft_train, sft_acc = _teacher_rows(_draw(pools, cfg, cfg.n_sft_train, rng), cfg, rng)
        sft_valid, _ = _teacher_rows(valid, cfg, rng)
        rl_train = _rl_rows(_draw(pools, cfg, cfg.n_train, rng))
        rl_valid = _rl_rows(valid)
        rows = {"sft_train": sft_train, "sft_valid": sft_valid, "rl_train": rl_train, "rl_valid": rl_valid}
        facts = {
            "teacher_accuracy": sft_acc,
            "valid_carry_fraction": sum(needs_carry(*p) for p in valid) / len(valid),
            "max_new_tokens": max_answer_tokens(cfg),
        }
        return TaskFiles(rows, save_arith_tokenizer, facts)

    return build_once(out_dir, cfg, make)


def max_answer_tokens(cfg: ArithTaskConfig) -> int:
    """The longest completion in tokens: marker, digits (the teacher's mistakes included), EOS."""
    longest = max(len(str(max(solve(*p), teacher_mistake(*p)))) for op in cfg.ops for p in _problems(op, cfg))
    return 1 + longest + 1


def arith_model_config(n_positions: int = 32) -> dict:
    """The arithmetic task's tiny llama-family decoder (d=128, 4 layers, 4 heads; 0.86M
    parameters). A ``ReaLModelConfig`` field dict: what the "real_model" factory takes as ``config=``."""
    return tiny_decoder_config(ARITH_DECODER, TOKENS, n_positions)


def exact_match(completions: list[str], answers: list[str]) -> float:
    """The fraction of completions whose final answer ``math_answer`` finds equal to the reference."""
    if len(completions) != len(answers):
        raise ValueError(f"exact_match: {len(completions)} completions for {len(answers)} answers")
    if not completions:
        return 0.0
    scores = math_answer_reward([""] * len(completions), list(completions), answer=list(answers))
    return float(sum(scores) / len(scores))
