"""The named PPO-family presets (``ppo_preset=<name>``): each a dict of ``PPOHyperparameters``
fields over ReaL's defaults, citing where its settings come from, and what a preset sets outside
``ppo.*``. ``ppo_config.make_ppo_hyperparameters`` applies them."""

from __future__ import annotations

from typing import Any

from realrl.api.core.model_api import GenerationHyperparameters
from realrl.impl.model.utils.policy_loss_options import PolicyLossOptions


def real_generation_defaults() -> GenerationHyperparameters:
    """ReaL's PPO sampling defaults: top_p 0.9, top_k 200, temperature 1."""
    return GenerationHyperparameters(max_new_tokens=256, top_p=0.9, top_k=200, temperature=1.0)


def lm_human_preferences_preset() -> dict[str, Any]:
    """OpenAI lm-human-preferences (stylistic tasks) as reproduced in "The N Implementation Details
    of RLHF with PPO": 24 sampled tokens at temperature 0.7 without stopping at EOS, truncation at
    "." after token 16 with reward -1 otherwise, adaptive KL from 0.15 (target 6, horizon 10000),
    gamma 1, lambda 0.95, rewards whitened without and advantages with the mean shift per
    minibatch, 4 epochs of 1 minibatch, no reward clipping, no value normalisation, no early
    stopping, no bootstrapping (the episode ends at the fixed length)."""
    return dict(
        gen=GenerationHyperparameters(
            max_new_tokens=24, min_new_tokens=24, fixed_length=True, temperature=0.7, top_k=0, top_p=1.0
        ),
        temperature_scale_logprobs=True,
        truncate_token=".",
        truncate_after=16,
        truncate_penalty=-1.0,
        max_reward_clip=None,
        reward_whiten=True,
        kl_ctl=0.15,
        kl_estimator="k1",
        adaptive_kl_ctl=True,
        adaptive_kl_target=6.0,
        adaptive_kl_horizon=10000.0,
        discount=1.0,
        gae_lambda=0.95,
        bootstrap_no_eos=False,
        adv_norm=True,
        whiten_scope="minibatch",
        ppo_n_epochs=4,
        ppo_n_minibatches=1,
        eps_clip=0.2,
        value_eps_clip=0.2,
        early_stop_imp_ratio=None,
        value_norm=False,
    )


def _critic_free(estimator: str, kl_ctl: float) -> dict[str, Any]:
    """K = 4 answers per prompt, no critic, a fixed KL coefficient in the reward (k1, per token;
    0: none), no advantage whitening beyond the estimator's own, one minibatch."""
    gen = real_generation_defaults()
    gen.n = 4
    return dict(
        gen=gen,
        adv_estimator=estimator,
        kl_ctl=kl_ctl,
        adaptive_kl_ctl=False,
        kl_loss_coef=0.0,
        adv_norm=False,
        value_norm=False,
        ppo_n_minibatches=1,
    )


def grpo_preset() -> dict[str, Any]:
    """GRPO (DeepSeekMath): 4 answers per prompt, group-normalised advantages, no critic, no KL
    in the reward, k3 KL to the reference in the loss with coefficient 0.04."""
    return {**_critic_free("grpo", kl_ctl=0.0), "kl_loss_coef": 0.04}


def dr_grpo_preset() -> dict[str, Any]:
    """Dr. GRPO ("Understanding R1-Zero-Like Training: A Critical Perspective", Liu et al. 2025): no
    division by the group's std and a constant length normaliser, which remove GRPO's biases
    towards easy prompts and long wrong answers; no KL term."""
    return {
        **grpo_preset(),
        "grpo_scale_by_std": False,
        "loss_agg_mode": "seq-mean-token-sum-norm",
        "kl_loss_coef": 0.0,
    }


def dapo_preset() -> dict[str, Any]:
    """DAPO ("DAPO: An Open-Source LLM Reinforcement Learning System at Scale", Yu et al. 2025):
    clip-higher (0.2 / 0.28), token-level loss aggregation, overlong reward shaping over the last
    fifth of the length budget, no KL term; and (an experiment option, below) dynamic sampling."""
    return {
        **grpo_preset(),
        "eps_clip": 0.2,
        "eps_clip_high": 0.28,
        "loss_agg_mode": "token-mean",
        "kl_loss_coef": 0.0,
        "overlong_buffer_ratio": 0.2,
        "overlong_penalty": 1.0,
    }


def gspo_preset() -> dict[str, Any]:
    """GSPO ("Group Sequence Policy Optimization", Zheng et al. 2025): the importance ratio of a
    whole answer (the geometric mean of its token ratios), clipped at 3e-4 / 4e-4, each answer
    weighted equally; group-normalised advantages, no KL term."""
    return {
        **grpo_preset(),
        "policy_loss": "gspo",
        "eps_clip": 3e-4,
        "eps_clip_high": 4e-4,
        "loss_agg_mode": "seq-mean-token-mean",
        "kl_loss_coef": 0.0,
    }


def _grpo_with_loss(policy_loss: str, **options: Any) -> dict[str, Any]:
    return {**grpo_preset(), "policy_loss": policy_loss, "kl_loss_coef": 0.0, **options}


def cispo_preset() -> dict[str, Any]:
    """CISPO ("MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning Attention", 2025):
    the importance weight clipped above only (verl's example: clip_ratio_low 10, high 0.2), its
    gradient through log pi; token-level aggregation, no KL term."""
    return _grpo_with_loss("cispo", eps_clip=10.0, eps_clip_high=0.2, loss_agg_mode="token-mean")


def gmpo_preset() -> dict[str, Any]:
    """GMPO ("Geometric-Mean Policy Optimization", Zhao et al. 2025): one ratio per answer, the
    geometric mean of its token ratios clipped to (e^-0.4, e^0.4); no KL term."""
    return _grpo_with_loss("geo_mean", eps_clip=0.4, eps_clip_high=0.4, loss_agg_mode="seq-mean-token-mean")


def sapo_preset() -> dict[str, Any]:
    """SAPO ("Soft Adaptive Policy Optimization", Gao et al. 2025): a sigmoid gate instead of the
    clip, temperatures 1.0 (A > 0) / 1.05 (A <= 0), each answer weighted equally; no KL term."""
    options = PolicyLossOptions(tau_pos=1.0, tau_neg=1.05)
    return _grpo_with_loss("sapo", policy_loss_options=options, loss_agg_mode="seq-mean-token-mean")


def rloo_preset() -> dict[str, Any]:
    """RLOO (Ahmadian et al. 2024): each answer's baseline is the mean score of the other answers
    to its prompt; the KL penalty in the reward."""
    return _critic_free("rloo", 0.05)


def reinforce_pp_preset() -> dict[str, Any]:
    """REINFORCE++ (Hu 2025): per-token KL in the reward, returns whitened over the whole batch;
    with ``adv_estimator=reinforce_pp_baseline`` the group mean is subtracted first."""
    return _critic_free("reinforce_pp", 0.05)


def remax_preset() -> dict[str, Any]:
    """ReMax (Li et al. 2023): the baseline of an answer is the score of the greedy answer to the
    same prompt (a second generate call and a second reward call in the graph)."""
    return _critic_free("remax", 0.05)


PRESETS = {
    "real": dict,
    "lm_human_preferences": lm_human_preferences_preset,
    "grpo": grpo_preset,
    "dr_grpo": dr_grpo_preset,
    "dapo": dapo_preset,
    "gspo": gspo_preset,
    "cispo": cispo_preset,
    "gmpo": gmpo_preset,
    "sapo": sapo_preset,
    "rloo": rloo_preset,
    "reinforce_pp": reinforce_pp_preset,
    "remax": remax_preset,
}

# what a preset sets outside ``ppo.*`` (the experiment's own options), as key=value overrides
PRESET_EXPERIMENT_OPTIONS = {
    # DAPO's dynamic sampling: prompts whose answers all score the same are replaced by others
    "dapo": ["dynamic_sampling.enabled=true"],
    # lm-human-preferences as "The N Implementation Details of RLHF with PPO" reproduces it: the
    # learning rate annealed linearly to zero, TensorFlow's Adam epsilon ("PyTorch Adam optimizer
    # numerical issues"), and the value head initialised to zero
    "lm_human_preferences": [
        "actor.optimizer.lr_scheduler_type=linear",
        "actor.optimizer.min_lr_ratio=0.0",
        "actor.optimizer.tf_style_eps=true",
        "critic.optimizer.lr_scheduler_type=linear",
        "critic.optimizer.min_lr_ratio=0.0",
        "critic.optimizer.tf_style_eps=true",
        "critic_head_init=zeros",
    ],
}
