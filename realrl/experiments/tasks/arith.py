"""The embedded verifiable task: two-digit addition and subtraction with reference answers.

SFT learns from a noisy teacher that often forgets to carry or borrow, so the SFT policy is right
on part of the held-out problems only; GRPO (and its relatives) then score each answer with the
math checker (``reward_fn=math_answer``, the reference reaching it through
``dataset.metadata_keys=[answer]``) and raise the held-out exact-match accuracy. The summary
reports the accuracy before (the SFT policy) and after RL, greedy decoding, on the same problems.
"""

from __future__ import annotations

from typing import Any

from realrl.api.core.model_api import GenerationHyperparameters
from realrl.experiments.tasks.base import (
    ONE_THREAD,
    Recipe,
    answer_rl_preset,
    answer_sft_preset,
    before_after,
    register_answer_task,
    rl_recipe,
)
from realrl.impl.dataset.toy.arith import ArithTaskConfig, arith_model_config, arith_paths, build_arith_task

MAX_NEW_TOKENS = 5  # "####", up to three digits, EOS
SFT_PRESET = answer_sft_preset(epochs=10, max_seqlen=32)
# its actor learning rate of 1e-4: 3e-4 sharpens the policy (KL ~3 nats) without making it right
RL_PRESET = answer_rl_preset(60, MAX_NEW_TOKENS, scoring=("reward_fn=math_answer",))


def exact_match_before_after(cfg: Any) -> dict[str, Any]:
    """Held-out exact-match accuracy of the SFT policy and of the policy after RL (greedy)."""
    from realrl.experiments.toy_eval import evaluate_policy
    from realrl.impl.rewards.math_answer import math_answer_reward

    run = before_after(ARITH, cfg)
    greedy = GenerationHyperparameters(max_new_tokens=MAX_NEW_TOKENS, greedy=True)

    def score(prompts: list[str], completions: list[str], metadata: dict[str, list]) -> list[float]:
        return math_answer_reward(prompts, completions, answer=metadata["answer"])

    tok, valid, n = run.files["tokenizer"], run.files["rl_valid"], cfg.toy_eval_prompts
    common = dict(metadata_keys=("answer",), seed=cfg.seed)
    before = evaluate_policy(run.before, None, tok, valid, greedy, score, n, **common)
    after = evaluate_policy(run.after, run.before, tok, valid, greedy, score, n, **common)
    return {
        "sft_accuracy": before.reward_mean,
        "accuracy": after.reward_mean,
        "accuracy_gain_points": 100 * (after.reward_mean - before.reward_mean),
        "kl": after.kl,
        "samples": after.samples,
    }


RL_RECIPE = rl_recipe(RL_PRESET, exact_match_before_after)

ARITH = register_answer_task(
    "arith",
    "two-digit addition and subtraction checked against reference answers",
    build_arith_task,
    ArithTaskConfig,
    arith_paths,
    arith_model_config,
    SFT_PRESET,
    RL_RECIPE,
    # PPO's critic starts from the SFT model, as there is no reward model
    ppo=rl_recipe(
        RL_PRESET + ("ppo.gen.n=1", "dataset.train_bs_n_seqs=128", "critic.optimizer.lr=1e-3"),
        exact_match_before_after,
    ),
    remax=RL_RECIPE,
    gen=Recipe(
        ONE_THREAD + (f"gen.max_new_tokens={MAX_NEW_TOKENS}", "gen.greedy=true"),
        {"dataset.path": "rl_valid", "tokenizer_path": "tokenizer"},
        {"model.path": "sft"},
    ),
)
