"""The default embedded task: a miniature InstructGPT pipeline that learns on 2 CPU cores.

A bigram language writes prompts and continuations; a hidden true reward (positive minus negative
words, -2 without a final '.') labels preference pairs. SFT starts from random weights, the reward
model and DPO from the SFT model, PPO from both; GRPO-family experiments score with the true
reward itself (``reward_fn=toy_sentiment``). README.md ("What the main job does") has the figures.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from realrl.experiments.tasks.base import EmbeddedTask, Recipe, final_checkpoint, register_task, sft_recipe
from realrl.impl.dataset.toy import ToyTaskConfig, build_toy_task
from realrl.impl.dataset.toy.corpus import toy_model_config, toy_paths

TOY_N_PROMPTS = 50000  # "2,4,4": ~10k SFT examples, ~16k RM pairs, ~20k PPO prompts

# the toy model is tiny: one thread per worker beats several (per-op overhead dominates)
ONE_THREAD = ("torch_threads=1",)
SFT_PRESET = ONE_THREAD + (
    "exp_ctrl.total_train_epochs=3",
    "model.optimizer.lr=3e-3",
    "model.optimizer.lr_scheduler_type=cosine",
    "model.optimizer.warmup_steps_proportion=0.1",
    "model.optimizer.min_lr_ratio=0.05",
    "model.optimizer.weight_decay=0.0",
    "dataset.train_bs_n_seqs=64",
    "dataset.max_seqlen=64",
)
RW_PRESET = ONE_THREAD + (
    "exp_ctrl.total_train_epochs=2",
    "model.optimizer.lr=5e-4",
    "model.optimizer.lr_scheduler_type=cosine",
    "model.optimizer.warmup_steps_proportion=0.1",
    "model.optimizer.min_lr_ratio=0.05",
    "dataset.train_bs_n_seqs=64",
    "dataset.max_seqlen=64",
    "dataset.max_pairs_per_prompt=1",
)
DPO_PRESET = ONE_THREAD + (
    "exp_ctrl.total_train_epochs=1",
    "actor.optimizer.lr=1e-4",
    "dataset.train_bs_n_seqs=64",
    "dataset.max_seqlen=64",
    "dataset.max_pairs_per_prompt=1",
)
GEN_PRESET = ONE_THREAD + ("gen.max_new_tokens=13", "dataset.max_prompt_len=16", "dataset.train_bs_n_seqs=64")
RL_SAMPLING = ("ppo.gen.max_new_tokens=13", "ppo.gen.top_p=1.0", "ppo.gen.top_k=0")
PPO_PRESET = ONE_THREAD + (
    "exp_ctrl.total_train_steps=30",
    "dataset.train_bs_n_seqs=256",
    "dataset.max_prompt_len=16",
    "actor.optimizer.lr=1e-4",
    "critic.optimizer.lr=3e-4",
    *RL_SAMPLING,
    "ppo.gen.temperature=1.0",
    "ppo.kl_ctl=0.1",
    "ppo.gae_lambda=0.95",
    "ppo.ppo_n_epochs=4",
    "ppo.ppo_n_minibatches=4",
)
# GRPO and its relatives (RLOO, REINFORCE++, ReMax): K answers per prompt, the true reward
GROUP_PRESET = ONE_THREAD + (
    "exp_ctrl.total_train_steps=30",
    "dataset.train_bs_n_seqs=64",
    "dataset.max_prompt_len=16",
    "actor.optimizer.lr=1e-4",
    "ppo.gen.n=4",
    *RL_SAMPLING,
    "ppo.ppo_n_epochs=4",
    "ppo.ppo_n_minibatches=4",
    "reward_fn=toy_sentiment",
)


def summarize_policy(cfg: Any) -> dict[str, Any]:
    """Held-out true reward of the policy before RL (the reference) and after, its KL to the
    reference, and the reward model's pair accuracy when one scored the rollouts."""
    from realrl.experiments.toy_eval import evaluate_policy, reward_model_accuracy, true_reward_scorer

    paths = SENTIMENT.paths(SENTIMENT.data_dir(cfg.fileroot, cfg.seed))
    before_path = cfg.ref.path or cfg.actor.path
    after_path = final_checkpoint(cfg.fileroot, cfg.experiment_name, cfg.trial_name, "actor")
    gconfig = dataclasses.replace(cfg.ppo.gen, n=1)
    n, tok, valid = cfg.toy_eval_prompts, paths["tokenizer"], paths["ppo_valid"]
    score = true_reward_scorer()
    before = evaluate_policy(before_path, None, tok, valid, gconfig, score, n, seed=cfg.seed)
    after = evaluate_policy(after_path, before_path, tok, valid, gconfig, score, n, seed=cfg.seed)
    rm_accuracy = None
    if cfg.uses_reward_model:
        rm_accuracy = reward_model_accuracy(cfg.rew.path, tok, paths["rm_valid"], seed=cfg.seed)
    return {
        "sft_true_reward_mean": before.reward_mean,
        "sft_true_reward_std": before.reward_std,
        "true_reward_mean": after.reward_mean,
        "true_reward_std": after.reward_std,
        "gain_in_sft_std": (after.reward_mean - before.reward_mean) / max(before.reward_std, 1e-8),
        "rm_accuracy": rm_accuracy,
        "kl": after.kl,
        "no_eos_fraction": after.no_eos_fraction,
        "samples": after.samples,
    }


def _build(data_dir: str, seed: int) -> dict[str, str]:
    build_toy_task(data_dir, ToyTaskConfig(seed=seed, n_prompts=TOY_N_PROMPTS))
    return toy_paths(data_dir)


RL_FILES = {"dataset.path": "ppo_train", "dataset.valid_path": "ppo_valid", "tokenizer_path": "tokenizer"}
GROUP_RECIPE = Recipe(GROUP_PRESET, RL_FILES, {"actor.path": "sft"}, summarize=summarize_policy)

SENTIMENT = register_task(
    EmbeddedTask(
        name="sentiment",
        label="toy",
        doc="prompts continued by a bigram language, a hidden word-sentiment reward (the default)",
        build=_build,
        paths=toy_paths,
        model_config=toy_model_config,
        recipes={
            "sft": sft_recipe(SFT_PRESET),
            "rw": Recipe(
                RW_PRESET,
                {
                    "dataset.train_path": "rm_train",
                    "dataset.valid_path": "rm_valid",
                    "tokenizer_path": "tokenizer",
                },
                {"model.path": "sft"},
            ),
            "dpo": Recipe(
                DPO_PRESET,
                {
                    "dataset.train_path": "rm_train",
                    "dataset.valid_path": "rm_valid",
                    "tokenizer_path": "tokenizer",
                },
                {"actor.path": "sft"},
            ),
            "gen": Recipe(
                GEN_PRESET,
                {"dataset.path": "ppo_valid", "tokenizer_path": "tokenizer"},
                {"model.path": "sft"},
            ),
            "ppo": Recipe(
                PPO_PRESET, RL_FILES, {"actor.path": "sft", "rew.path": "rw"}, summarize=summarize_policy
            ),
            "grpo": GROUP_RECIPE,
            "rloo": GROUP_RECIPE,
            "reinforce_pp": GROUP_RECIPE,
            "remax": GROUP_RECIPE,
        },
    )
)
