"""Arithmetic questions in the model's chat format, one JSON-lines file per training phase.

    python examples/real_model/make_arith_prompts.py --model outputs/smollm2-135m-instruct --out outputs/arith

writes, under ``--out``:

| file | dataset (realrl/impl/dataset) | row |
|---|---|---|
| ``sft.jsonl``, ``sft_valid.jsonl`` | ``prompt_answer`` (``quickstart sft``) | ``{"prompt", "answer"}``: a worked answer ending ``#### n`` |
| ``rw.jsonl``, ``rw_valid.jsonl`` | ``rw_paired`` (``quickstart rw`` / ``dpo``) | ``{"prompt", "chosen", "rejected"}``: the right answer, a wrong one |
| ``rl_train.jsonl``, ``rl_valid.jsonl`` | ``prompt`` (``quickstart ppo`` / ``grpo``) | ``{"prompt", "answer"}``: ``answer`` the bare number, for ``dataset.metadata_keys=[answer]`` |

A question is "What is 23 + 58? Put the final answer after ####." (``+``, ``-``, ``*`` of numbers
below ``--max-operand``; ``--terms 3`` asks "What is 23 + 58 * 3?", products first). Every question appears in one file of one split only: the validation files
and ``rl_valid`` share no question with any training file.

``--format text`` (default) writes each prompt already rendered by the tokenizer's chat template
with the generation prompt (``<|im_start|>system ... <|im_start|>assistant\\n``), and answers as
plain text, to which the datasets append EOS (``<|im_end|>``): a sequence is exactly the chat
transcript, ending at EOS. ``--format messages`` writes ``[{"role", "content"}]`` lists instead,
which realrl renders with the same template when it loads them (no ``--model`` needed; the
template then ends an answer with ``<|im_end|>\\n``).

Deterministic: the same ``--seed`` and sizes give the same files byte for byte.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys

SUFFIX = "Put the final answer after ####."
OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


def question(expr: str) -> str:
    return f"What is {expr}? {SUFFIX}"


def worked_answer(expr: str, value: int) -> str:
    return f"{expr} = {value}\n#### {value}"


def expression(terms: tuple) -> str:
    """(23, "+", 58, "*", 3) -> "23 + 58 * 3"."""
    return " ".join(str(t) for t in terms)


def value_of(terms: tuple) -> int:
    """The usual precedence: products first, then sums and differences left to right."""
    products = [terms[0]]
    signs = [1]
    for op, x in zip(terms[1::2], terms[2::2]):
        if op == "*":
            products[-1] = OPS["*"](products[-1], x)
        else:
            products.append(x)
            signs.append(1 if op == "+" else -1)
    return sum(s * p for s, p in zip(signs, products))


def wrong_value(value: int, rng: random.Random) -> int:
    """A plausible wrong answer: off by one, by ten, or a sign/digit slip."""
    delta = rng.choice([1, -1, 2, -2, 10, -10, 100, -100])
    wrong = value + delta
    if rng.random() < 0.2 and value != 0:
        wrong = -value
    return wrong if wrong != value else value + 1


def all_questions(max_operand: int, ops: str) -> list[tuple]:
    return [(a, op, b) for op in ops for a in range(max_operand) for b in range(max_operand)]


def drawn_questions(max_operand: int, ops: str, n_terms: int, n: int, rng: random.Random) -> list[tuple]:
    """``n`` distinct random expressions of ``n_terms`` operands (too many to list them all)."""
    space = max_operand**n_terms * len(ops) ** (n_terms - 1)
    if n > space // 2:
        raise SystemExit(
            f"error: {n} distinct questions asked for; draw at most {space // 2} with these options"
        )
    seen: set[tuple] = set()
    out: list[tuple] = []
    while len(out) < n:
        terms: list = [rng.randrange(max_operand)]
        for _ in range(n_terms - 1):
            terms += [rng.choice(ops), rng.randrange(max_operand)]
        if tuple(terms) not in seen:
            seen.add(tuple(terms))
            out.append(tuple(terms))
    return out


def render(tokenizer, content: str) -> str:
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
    )


def build(args: argparse.Namespace, tokenizer) -> dict[str, list[dict]]:
    rng = random.Random(args.seed)
    sizes = {
        "sft": args.n_sft,
        "sft_valid": args.n_valid,
        "rw": args.n_rw,
        "rw_valid": args.n_valid,
        "rl_train": args.n_rl,
        "rl_valid": args.n_valid,
    }
    # only the phases asked for draw questions, so a small task can hold more of them out
    sizes = {name: n for name, n in sizes.items() if name.split("_")[0] in args.phases}
    if args.terms == 2:
        pool = all_questions(args.max_operand, args.ops)
        rng.shuffle(pool)
    else:
        pool = drawn_questions(args.max_operand, args.ops, args.terms, sum(sizes.values()), rng)
    if sum(sizes.values()) > len(pool):
        raise SystemExit(
            f"error: {sum(sizes.values())} distinct questions asked for but only {len(pool)} exist "
            f"with --max-operand {args.max_operand} --ops {args.ops}"
        )

    def prompt(content: str):
        if args.format == "text":
            return render(tokenizer, content)
        return [{"role": "user", "content": content}]

    def reply(text: str):
        return text if args.format == "text" else [{"role": "assistant", "content": text}]

    out: dict[str, list[dict]] = {}
    start = 0
    for name, n in sizes.items():
        rows = []
        for terms in pool[start : start + n]:
            expr, value = expression(terms), value_of(terms)
            p = prompt(question(expr))
            if name.startswith("sft"):
                rows.append({"prompt": p, "answer": reply(worked_answer(expr, value))})
            elif name.startswith("rw"):
                bad = wrong_value(value, rng)
                rows.append(
                    {
                        "prompt": p,
                        "chosen": reply(worked_answer(expr, value)),
                        "rejected": reply(worked_answer(expr, bad)),
                    }
                )
            else:
                rows.append({"prompt": p, "answer": str(value)})
        out[name] = rows
        start += n
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="an HF folder whose tokenizer has the chat template (--format text)")
    p.add_argument("--out", default="outputs/arith", help="folder for the .jsonl files")
    p.add_argument("--format", choices=("text", "messages"), default="text")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--n-sft", type=int, default=2000)
    p.add_argument("--n-rw", type=int, default=1000)
    p.add_argument("--n-rl", type=int, default=1000)
    p.add_argument("--n-valid", type=int, default=100, help="rows of each *_valid file")
    p.add_argument("--max-operand", type=int, default=100, help="operands are 0 .. max-operand - 1")
    p.add_argument("--ops", default="+-*", help="operators to draw from, a subset of '+-*'")
    p.add_argument("--terms", type=int, default=2, help="operands per question (3: '7 + 12 * 3')")
    p.add_argument(
        "--phases",
        default="sft,rw,rl",
        help="whose files to write, comma-separated from sft, rw, rl ('rl': rl_train and rl_valid only)",
    )
    args = p.parse_args(argv)
    args.phases = [x.strip() for x in args.phases.split(",") if x.strip()]
    if not args.phases or set(args.phases) - {"sft", "rw", "rl"}:
        p.error(f"--phases must name some of sft, rw, rl; got {','.join(args.phases) or 'none'!r}")
    if not args.ops or set(args.ops) - set(OPS):
        p.error(f"--ops must be a non-empty subset of {''.join(OPS)!r}")
    if args.terms < 2:
        p.error(f"--terms must be >= 2, got {args.terms}")
    args.ops = "".join(sorted(set(args.ops), key="+-*".index))

    tokenizer = None
    if args.format == "text":
        if not args.model:
            p.error("--format text needs --model (the folder whose chat template renders the prompts)")
        import transformers

        tokenizer = transformers.AutoTokenizer.from_pretrained(args.model)
        if not getattr(tokenizer, "chat_template", None):
            print(f"error: the tokenizer in {args.model} has no chat template", file=sys.stderr)
            return 2

    files = build(args, tokenizer)
    os.makedirs(args.out, exist_ok=True)
    for name, rows in files.items():
        path = os.path.join(args.out, f"{name}.jsonl")
        tmp = f"{path}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        os.replace(tmp, path)
        print(f"{path}: {len(rows)} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
