"""Held-out evaluation on an embedded task: a policy's score under the task's own checker (the
sentiment task's true reward, the arithmetic task's exact match), its KL to the reference, and a
reward model's pair accuracy.

Everything goes through the same registered datasets, model factory, inference engine and
interfaces as a run, on checkpoints read back from disk.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import torch

import realrl.impl.builtin  # noqa: F401  (the datasets, model factory and engines it builds by name)
from realrl.api.core.config import DatasetAbstraction, ModelAbstraction
from realrl.api.core.data_api import MicroBatchSpec, SequenceSample, make_dataset
from realrl.api.core.model_api import GenerationHyperparameters, Model, make_backend, make_model
from realrl.impl.dataset.toy.corpus import toy_sentiment_reward
from realrl.impl.interface.rw_interface import PairedRewardInterface

EVAL_MB = MicroBatchSpec(n_mbs=1, max_tokens_per_mb=8192)


def load_for_inference(path: str, tokenizer_path: str, is_critic: bool = False) -> Model:
    args = {"path": path, "is_critic": is_critic, "tokenizer_path": tokenizer_path}
    model = make_model(ModelAbstraction("real_model", args), "critic" if is_critic else "actor")
    return make_backend("inference").initialize(model, None)


def load_batch(name: str, args: dict, tokenizer, limit: int | None = None, seed: int = 1) -> SequenceSample:
    dataset = make_dataset(DatasetAbstraction(name, args), seed, 0, 1, tokenizer)
    n = len(dataset) if limit is None else min(limit, len(dataset))
    return SequenceSample.gather([dataset[i] for i in range(n)])


# (prompts, completions, metadata lists) -> one score per completion
Scorer = Callable[[list[str], list[str], dict[str, list]], list[float]]


def true_reward_scorer(density: bool = False) -> Scorer:
    """The sentiment task's hidden true reward (``density``: per 10 words, the long-answer task's)."""
    per_words = 10 if density else None
    return lambda prompts, completions, metadata: toy_sentiment_reward(
        prompts, completions, per_words=per_words
    )


@dataclasses.dataclass
class PolicyEvaluation:
    reward_mean: float
    reward_std: float
    kl: float | None  # mean over sequences of the summed per-token KL(pi || pi_ref), nats
    no_eos_fraction: float
    samples: list[dict]  # a few held-out prompts, answers and their scores


def _texts(gen, tokenizer) -> tuple[list[str], list[str]]:
    """(prompts, completions) of a generation, decoded."""
    seqs = torch.split(gen.sequences, gen.seqlens)
    prompts = [s[:p].tolist() for s, p in zip(seqs, gen.prompt_lens)]
    answers = [s[p:].tolist() for s, p in zip(seqs, gen.prompt_lens)]
    decode = tokenizer.batch_decode
    return decode(prompts, skip_special_tokens=True), decode(answers, skip_special_tokens=True)


def _sequence_kl(policy: Model, ref: Model, gen) -> torch.Tensor:
    """sum over response positions of sum_v p(v) (log p(v) - log q(v)): the exact KL per token."""
    batch = SequenceSample.from_default(
        list(range(len(gen.seqlens))), gen.seqlens, {"packed_input_ids": gen.sequences}
    )

    def log_probs(out, mb):
        return torch.log_softmax(out.float(), dim=-1)

    logp = policy.module.forward(batch, EVAL_MB, post_hook=log_probs)
    logq = ref.module.forward(batch, EVAL_MB, post_hook=log_probs)
    per_token = (logp.exp() * (logp - logq)).sum(-1)
    kls, start = [], 0
    for length, prompt_len in zip(gen.seqlens, gen.prompt_lens):
        # positions prompt_len-1 .. length-2 predict the response tokens
        kls.append(per_token[start + prompt_len - 1 : start + length - 1].sum())
        start += length
    return torch.stack(kls)


@torch.no_grad()
def evaluate_policy(
    policy_path: str,
    ref_path: str | None,
    tokenizer_path: str,
    prompts_path: str,
    gconfig: GenerationHyperparameters,
    score: Scorer,
    n_prompts: int = 800,
    seed: int = 1,
    metadata_keys: tuple[str, ...] = (),
) -> PolicyEvaluation:
    """Sample one answer per held-out prompt and score it with ``score`` (the rows'
    ``metadata_keys`` fields, such as a reference answer, reach it as lists)."""
    policy = load_for_inference(policy_path, tokenizer_path)
    tok = policy.tokenizer
    args = {"dataset_path": prompts_path, "metadata_keys": list(metadata_keys)}
    prompts = load_batch("prompt", args, tok, n_prompts, seed)
    torch.manual_seed(seed)
    gen = policy.module.generate(prompts, EVAL_MB, tok, dataclasses.replace(gconfig, n=1))
    prompt_texts, completions = _texts(gen, tok)
    rewards = np.array(score(prompt_texts, completions, {k: list(v) for k, v in prompts.metadata.items()}))
    kl = None
    if ref_path is not None:
        kl = float(_sequence_kl(policy, load_for_inference(ref_path, tokenizer_path), gen).mean())
    return PolicyEvaluation(
        reward_mean=float(rewards.mean()),
        reward_std=float(rewards.std()),
        kl=kl,
        no_eos_fraction=float(gen.no_eos.float().mean()),
        samples=[
            {"prompt": p, "completion": c, "reward": round(float(r), 4)}
            for p, c, r in zip(prompt_texts[:5], completions[:5], rewards[:5])
        ],
    )


@torch.no_grad()
def reward_model_accuracy(rm_path: str, tokenizer_path: str, pairs_path: str, seed: int = 1) -> float:
    """Held-out pair accuracy through the ``paired_rw`` interface's own evaluation."""
    model = load_for_inference(rm_path, tokenizer_path, is_critic=True)
    batch = load_batch(
        "rw_paired", {"dataset_path": pairs_path, "max_pairs_per_prompt": 1}, model.tokenizer, seed=seed
    )
    batches = batch.split(MicroBatchSpec(max_tokens_per_mb=8192))
    return float(PairedRewardInterface().evaluate(model, batches)["eval_accuracy"])
