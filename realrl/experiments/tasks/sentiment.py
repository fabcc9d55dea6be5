"""The default embedded task: a miniature InstructGPT pipeline that learns on 2 CPU cores.

A bigram language writes prompts and continuations; a hidden true reward (positive minus negative
words, -2 without a final '.') labels preference pairs. SFT starts from random weights, the reward
model and DPO from the SFT model, PPO from both; GRPO-family experiments score with the true
reward itself (``reward_fn=toy_sentiment``). README.md ("What the main job does") has the figures.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from realrl.experiments.tasks.base import (
    ONE_THREAD,
    EmbeddedTask,
    Recipe,
    before_after,
    get_task,
    register_task,
    sft_recipe,
)
from realrl.impl.dataset.toy import ToyTaskConfig, build_toy_task
from realrl.impl.dataset.toy.corpus import toy_model_config, toy_paths

TOY_N_PROMPTS = 50000  # "2,4,4": ~10k SFT examples, ~16k RM pairs, ~20k PPO prompts

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
MAX_NEW_TOKENS = 13  # 11 words, '.', EOS
# the distillation teacher: twice the toy model's width, 3.97x its parameters (626k vs 158k)
TEACHER_SHAPE = ("model_shape.hidden_dim=128", "model_shape.intermediate_dim=576")


def gen_preset(max_new_tokens: int) -> tuple[str, ...]:
    return ONE_THREAD + (
        f"gen.max_new_tokens={max_new_tokens}",
        "dataset.max_prompt_len=16",
        "dataset.train_bs_n_seqs=64",
    )


def rl_sampling(max_new_tokens: int) -> tuple[str, ...]:
    return (f"ppo.gen.max_new_tokens={max_new_tokens}", "ppo.gen.top_p=1.0", "ppo.gen.top_k=0")


def ppo_preset(max_new_tokens: int, steps: int = 30, updates: tuple[int, int] = (4, 4)) -> tuple[str, ...]:
    """``updates``: (epochs, minibatches) of each batch."""
    return ONE_THREAD + (
        f"exp_ctrl.total_train_steps={steps}",
        "dataset.train_bs_n_seqs=256",
        "dataset.max_prompt_len=16",
        "actor.optimizer.lr=1e-4",
        "critic.optimizer.lr=3e-4",
        *rl_sampling(max_new_tokens),
        "ppo.gen.temperature=1.0",
        "ppo.kl_ctl=0.1",
        "ppo.gae_lambda=0.95",
        f"ppo.ppo_n_epochs={updates[0]}",
        f"ppo.ppo_n_minibatches={updates[1]}",
    )


def group_preset(
    max_new_tokens: int, reward_fn: str = "toy_sentiment", steps: int = 30, updates: tuple[int, int] = (4, 4)
) -> tuple[str, ...]:
    """GRPO and its relatives (RLOO, REINFORCE++, ReMax): K answers per prompt, the true reward."""
    return ONE_THREAD + (
        f"exp_ctrl.total_train_steps={steps}",
        "dataset.train_bs_n_seqs=64",
        "dataset.max_prompt_len=16",
        "actor.optimizer.lr=1e-4",
        "ppo.gen.n=4",
        *rl_sampling(max_new_tokens),
        f"ppo.ppo_n_epochs={updates[0]}",
        f"ppo.ppo_n_minibatches={updates[1]}",
        f"reward_fn={reward_fn}",
    )


GEN_PRESET = gen_preset(MAX_NEW_TOKENS)
RL_SAMPLING = rl_sampling(MAX_NEW_TOKENS)
PPO_PRESET = ppo_preset(MAX_NEW_TOKENS)
GROUP_PRESET = group_preset(MAX_NEW_TOKENS)


def summarize_policy(cfg: Any, task: str = "sentiment", density: bool = False) -> dict[str, Any]:
    """Held-out true reward of the policy before RL (the reference) and after, its KL to the
    reference, and the reward model's pair accuracy when one scored the rollouts. ``task``: the
    toy task's name; ``density``: its true reward is per 10 words."""
    from realrl.experiments.toy_eval import evaluate_policy, reward_model_accuracy, true_reward_scorer

    run = before_after(get_task(task), cfg)
    paths = run.files
    gconfig = dataclasses.replace(cfg.ppo.gen, n=1)
    n, tok, valid = cfg.toy_eval_prompts, paths["tokenizer"], paths["ppo_valid"]
    score = true_reward_scorer(density)
    before = evaluate_policy(run.before, None, tok, valid, gconfig, score, n, seed=cfg.seed)
    after = evaluate_policy(run.after, run.before, tok, valid, gconfig, score, n, seed=cfg.seed)
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


def summarize_distillation(cfg: Any, task: str = "sentiment", density: bool = False) -> dict[str, Any]:
    """``summarize_policy`` of the distilled student, and the teacher's held-out true reward and
    the student's exact reverse KL to it (before: the SFT policy's), summed per answer."""
    from realrl.experiments.toy_eval import evaluate_policy, true_reward_scorer

    out = summarize_policy(cfg, task, density)
    run = before_after(get_task(task), cfg)
    gconfig = dataclasses.replace(cfg.ppo.gen, n=1)
    common = (run.files["tokenizer"], run.files["ppo_valid"], gconfig, true_reward_scorer(density))
    n, teacher = cfg.toy_eval_prompts, cfg.teacher.path
    teacher_eval = evaluate_policy(teacher, None, *common, n, seed=cfg.seed)
    before = evaluate_policy(run.before, teacher, *common, n, seed=cfg.seed)
    after = evaluate_policy(run.after, teacher, *common, n, seed=cfg.seed)
    out.update(
        teacher_true_reward_mean=teacher_eval.reward_mean,
        teacher_true_reward_std=teacher_eval.reward_std,
        sft_kl_to_teacher=before.kl,
        kl_to_teacher=after.kl,
    )
    return out


RL_FILES = {"dataset.path": "ppo_train", "dataset.valid_path": "ppo_valid", "tokenizer_path": "tokenizer"}
PAIR_FILES = {
    "dataset.train_path": "rm_train",
    "dataset.valid_path": "rm_valid",
    "tokenizer_path": "tokenizer",
}


def toy_task(
    name: str,
    label: str,
    doc: str,
    toy: dict[str, Any],
    max_new_tokens: int,
    n_positions: int,
    rl_steps: int = 30,
    updates: tuple[int, int] = (4, 4),
    n_experts: int = 0,
    data_label: str | None = None,
) -> EmbeddedTask:
    """A toy-corpus task: ``toy`` are its ``ToyTaskConfig`` fields beyond the seed and size, its
    answers at most ``max_new_tokens`` long, its model ``n_positions`` long (a Mixture of Experts
    of ``n_experts``, top-2, when > 0); its RL runs ``rl_steps`` steps of ``updates`` (epochs,
    minibatches) each; ``data_label``: another task's data folder it reads."""

    def build(data_dir: str, seed: int) -> dict[str, str]:
        build_toy_task(data_dir, ToyTaskConfig(seed=seed, n_prompts=TOY_N_PROMPTS, **toy))
        return toy_paths(data_dir)

    density = bool(toy.get("density_reward"))
    summarize = functools.partial(summarize_policy, task=name, density=density)
    reward_fn = "toy_sentiment_density" if density else "toy_sentiment"
    group = Recipe(
        group_preset(max_new_tokens, reward_fn, rl_steps, updates),
        RL_FILES,
        {"actor.path": "sft"},
        summarize=summarize,
    )
    # on-policy distillation (``opd``) from a teacher 4x the student's size, trained by GRPO first
    teacher_sft = sft_recipe(SFT_PRESET + TEACHER_SHAPE)
    teacher_rl = dataclasses.replace(group, checkpoints={"actor.path": "opd_teacher_sft"}, summarize=None)
    distill = Recipe(
        group_preset(max_new_tokens, reward_fn, rl_steps, updates),  # the reward is only watched
        RL_FILES,
        {"actor.path": "sft", "teacher.path": "opd_teacher"},
        summarize=functools.partial(summarize_distillation, task=name, density=density),
        roles={"teacher.path": "actor"},
    )
    return EmbeddedTask(
        name=name,
        label=label,
        doc=doc,
        build=build,
        paths=toy_paths,
        model_config=functools.partial(toy_model_config, n_positions=n_positions, n_experts=n_experts),
        recipes={
            "sft": sft_recipe(SFT_PRESET),
            "rw": Recipe(RW_PRESET, PAIR_FILES, {"model.path": "sft"}),
            "dpo": Recipe(DPO_PRESET, PAIR_FILES, {"actor.path": "sft"}),
            "gen": Recipe(
                gen_preset(max_new_tokens),
                {"dataset.path": "ppo_valid", "tokenizer_path": "tokenizer"},
                {"model.path": "sft"},
            ),
            "ppo": Recipe(
                ppo_preset(max_new_tokens, rl_steps, updates),
                RL_FILES,
                {"actor.path": "sft", "rew.path": "rw"},
                summarize=summarize,
            ),
            "grpo": group,
            "rloo": group,
            "reinforce_pp": group,
            "remax": group,
            "opd_teacher_sft": teacher_sft,
            "opd_teacher": teacher_rl,
            "opd": distill,
        },
        data_label=data_label,
    )


SENTIMENT = register_task(
    toy_task(
        "sentiment",
        "toy",
        "prompts continued by a bigram language, a hidden word-sentiment reward (the default)",
        {},
        MAX_NEW_TOKENS,
        n_positions=64,
    )
)
# answers of 4 to 44 words, one update per batch (as DeepSeekMath's GRPO): generation dominates
# the step and its lengths vary widely, the workload asynchronous RL is for
# (benchmarks/bench_async.py)
SENTIMENT_LONG = register_task(
    toy_task(
        "sentiment_long",
        "toy_long",
        "the sentiment task with answers of 4 to 44 words and one update per batch (generation-heavy)",
        {"response_words": 4, "response_words_max": 44, "density_reward": True},
        46,
        n_positions=64,
        rl_steps=60,
        updates=(1, 1),
    )
)
# the sentiment task's data and recipes with a Mixture-of-Experts model (4 experts of half the dense
# MLP's width, top-2: the dense model's active parameters, twice its MLP weights); its runs and
# checkpoints live under their own trial (toy_moe-seed<seed>), its data is the sentiment task's
SENTIMENT_MOE = register_task(
    toy_task(
        "sentiment_moe",
        "toy_moe",
        "the sentiment task with a Mixture-of-Experts model (4 experts, top-2; docs/model.md)",
        {},
        MAX_NEW_TOKENS,
        n_positions=64,
        n_experts=4,
        data_label="toy",
    )
)
