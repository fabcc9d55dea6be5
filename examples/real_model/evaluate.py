"""Held-out accuracy of a checkpoint folder on problems with reference answers.

    python examples/real_model/evaluate.py CHECKPOINT --data outputs/arith/rl_valid.jsonl
    python examples/real_model/evaluate.py CHECKPOINT --data ... --hf   # transformers' generate
    python examples/real_model/evaluate.py BASE --data ... --hf --adapter ADAPTER   # peft on BASE

``CHECKPOINT`` is an HF folder (``make_hf_folder.py``) or one a realrl run saved. Rows are the
``prompt`` dataset's (``{"prompt", "answer"}``, as ``make_arith_prompts.py`` writes ``rl_*.jsonl``);
they are read and tokenized by that dataset, so both modes decode the very same token ids. An
answer is right when realrl's ``math_answer`` reward (the last ``\\boxed{}``, else ``#### n``, else
the last number) equals the reference.

Default mode generates through realrl's own inference engine: greedy accuracy, then ``--k``
answers per problem at temperature 1 (no top-p / top-k) for pass@k (a problem counts when any of
its answers is right) and the mean accuracy of the sampled answers. ``--hf`` decodes the same
prompts greedily with ``transformers.AutoModelForCausalLM.generate`` (left-padded batches), to
check that realrl's greedy figure is the model's and not the engine's; with ``--adapter`` the
model is ``peft``'s ``PeftModel`` of that adapter folder (a LoRA run's ``checkpoints/actor/final/adapter``)
on the base folder ``CHECKPOINT``. One JSON line is printed (and written to ``--out``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

import torch

from realrl.api.core.data_api import MicroBatchSpec, SequenceSample
from realrl.api.core.model_api import GenerationHyperparameters
from realrl.experiments.toy_eval import load_batch, load_for_inference
from realrl.impl.rewards.math_answer import math_answer_reward


def score(completions: list[str], answers: list[str]) -> list[float]:
    return math_answer_reward([""] * len(completions), completions, answer=answers)


def prompt_ids(prompts: SequenceSample) -> list[list[int]]:
    return [
        t.tolist()
        for t in torch.split(prompts.data["packed_prompts"], prompts.flat_seqlens("packed_prompts"))
    ]


def realrl_completions(
    model, prompts: SequenceSample, gconfig: GenerationHyperparameters, mb_tokens: int
) -> list[str]:
    """Generated answers, prompt-major (the ``n`` answers of prompt 0, then of prompt 1, ...)."""
    gen = model.module.generate(
        prompts, MicroBatchSpec(max_tokens_per_mb=mb_tokens), model.tokenizer, gconfig
    )
    seqs = torch.split(gen.sequences, gen.seqlens)
    answers = [s[p:].tolist() for s, p in zip(seqs, gen.prompt_lens)]
    return model.tokenizer.batch_decode(answers, skip_special_tokens=True)


def in_pieces(prompts: SequenceSample, mb_tokens: int, what: str, generate) -> list[str]:
    """``generate`` on each micro-batch the engine would cut ``prompts`` into (``mb_tokens``), in
    order, behind a progress bar: the same answers as one call, which decodes those pieces anyway."""
    from tqdm import tqdm

    out: list[str] = []
    with tqdm(total=prompts.bs, desc=what, unit="problem", file=sys.stderr, mininterval=2.0) as bar:
        for piece in prompts.split(MicroBatchSpec(max_tokens_per_mb=mb_tokens)):
            out += generate(piece)
            bar.update(piece.bs)
    return out


def hf_completions(
    path: str, tokenizer, ids: list[list[int]], max_new_tokens: int, batch: int, adapter: str | None = None
) -> list[str]:
    """Greedy answers from transformers' own generate, left-padded with the attention mask
    (``adapter``: a peft LoRA folder loaded on the model first)."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    if adapter is not None:
        import peft

        model = peft.PeftModel.from_pretrained(model, adapter)
    model.eval()
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    out: list[str] = []
    for start in range(0, len(ids), batch):
        chunk = ids[start : start + batch]
        width = max(len(x) for x in chunk)
        input_ids = torch.tensor([[pad] * (width - len(x)) + x for x in chunk])
        mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in chunk])
        with torch.no_grad():
            gen = model.generate(
                input_ids=input_ids,
                attention_mask=mask,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=pad,
                eos_token_id=tokenizer.eos_token_id,
            )
        out += tokenizer.batch_decode(gen[:, width:], skip_special_tokens=True)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint", help="an HF folder or a realrl-saved checkpoint folder")
    p.add_argument("--data", required=True, help="jsonl rows {prompt, answer}")
    p.add_argument("--tokenizer", help="folder with the tokenizer (default: the checkpoint)")
    p.add_argument("-n", "--n", type=int, default=100, help="problems, from the top of --data")
    p.add_argument("--k", type=int, default=8, help="sampled answers per problem for pass@k (0: skip)")
    p.add_argument("--pass-n", type=int, help="problems for pass@k, the first of the -n (default: all)")
    p.add_argument("--max-new-tokens", type=int, default=24)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--batch", type=int, default=32, help="prompts per generation batch")
    p.add_argument("--hf", action="store_true", help="greedy only, through transformers' generate")
    p.add_argument("--adapter", help="with --hf: a peft adapter folder to load on CHECKPOINT (the base)")
    p.add_argument("--samples", type=int, default=3, help="problems whose greedy answers are printed")
    p.add_argument("--out", help="also write the JSON result to this file")
    args = p.parse_args(argv)
    if args.adapter and not args.hf:
        p.error("--adapter needs --hf (realrl evaluates a LoRA run's merged checkpoint folder itself)")
    for what, path in (("checkpoint", args.checkpoint), ("--data", args.data), ("--adapter", args.adapter)):
        if path is not None and not os.path.exists(path):
            print(f"error: {what} {path} does not exist", file=sys.stderr)
            return 2
    tok_path = args.tokenizer or args.checkpoint

    t0 = time.perf_counter()
    torch.manual_seed(args.seed)
    mode = ("peft" if args.adapter else "hf") if args.hf else "realrl"
    result: dict = {"checkpoint": args.checkpoint, "data": args.data, "mode": mode}
    if args.adapter:
        result["adapter"] = args.adapter
    if args.hf:
        import transformers

        tok = transformers.AutoTokenizer.from_pretrained(tok_path)
        prompts = load_batch("prompt", {"dataset_path": args.data, "metadata_keys": ["answer"]}, tok, args.n)
        greedy = hf_completions(
            args.checkpoint, tok, prompt_ids(prompts), args.max_new_tokens, args.batch, args.adapter
        )
    else:
        model = load_for_inference(args.checkpoint, tok_path)
        tok = model.tokenizer
        prompts = load_batch("prompt", {"dataset_path": args.data, "metadata_keys": ["answer"]}, tok, args.n)
        mb_tokens = args.batch * max(prompts.flat_seqlens("packed_prompts"))
        base = GenerationHyperparameters(max_new_tokens=args.max_new_tokens, top_p=1.0, top_k=0)
        greedy_config = dataclasses.replace(base, greedy=True)
        greedy = in_pieces(
            prompts, mb_tokens, "greedy", lambda p: realrl_completions(model, p, greedy_config, mb_tokens)
        )
    answers = [str(a) for a in prompts.metadata["answer"]]
    right = score(greedy, answers)
    n = len(answers)
    result.update(n=n, accuracy=round(sum(right) / n, 4))
    if not args.hf and args.k > 0:
        n_pass = min(args.pass_n or n, n)
        some = prompts if n_pass == n else prompts.split_with_lengths([n_pass, n - n_pass])[0]
        sampled_config = dataclasses.replace(base, n=args.k)
        sampled = in_pieces(
            some,
            mb_tokens,
            f"{args.k} answers each",
            lambda p: realrl_completions(model, p, sampled_config, mb_tokens),
        )
        hits = score(sampled, [a for a in answers[:n_pass] for _ in range(args.k)])
        per_problem = [max(hits[i * args.k : (i + 1) * args.k]) for i in range(n_pass)]
        result.update(
            k=args.k,
            pass_n=n_pass,
            pass_at_k=round(sum(per_problem) / n_pass, 4),
            sampled_accuracy=round(sum(hits) / len(hits), 4),
        )
    result["seconds"] = round(time.perf_counter() - t0, 1)
    result["samples"] = [{"answer": a, "greedy": g} for a, g in zip(answers[: args.samples], greedy)]
    result["greedy"] = greedy  # every answer, so two modes can be compared problem by problem
    print(json.dumps({k: v for k, v in result.items() if k != "greedy"}))
    if args.out:
        tmp = f"{args.out}.tmp"
        with open(tmp, "w") as f:
            json.dump(result, f)
        os.replace(tmp, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
