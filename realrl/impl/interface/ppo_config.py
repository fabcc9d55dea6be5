"""Every PPO / GRPO option in one dataclass, with ReaL's defaults and named presets.

Items of "The N Implementation Details of RLHF with PPO" map to fields (by its numbered lists):
  general 4  "fixed-length response"          gen.fixed_length, gen.min_new_tokens = gen.max_new_tokens
  PPO 1      "scale logits by temperature"    temperature_scale_logprobs (gen.temperature)
  PPO 5      "rejection sampling"             truncate_token, truncate_after, truncate_penalty
  PPO 6      "discount factor = 1"            discount
  PPO 7      "batches and minibatches"        ppo_n_epochs, ppo_n_minibatches (reshuffled every epoch)
  PPO 8      "per-token KL penalty"           kl_ctl, kl_estimator (k1; k3 as an option)
  PPO 9      "reward / advantage whitening"   reward_whiten (no mean shift), adv_norm (mean shift),
                                              whiten_scope ("minibatch" as OpenAI, "batch" as ReaL)
  PPO 10     "clipped value function"         value_eps_clip
  PPO 11     "adaptive KL"                    adaptive_kl_ctl, adaptive_kl_target, adaptive_kl_horizon
and beyond that post: missing_eos_penalty (TRL), mask_no_eos_with_zero, max_reward_clip,
reward_output_scaling / _bias, value_norm, early_stop_imp_ratio / early_stop_kl (ReaL), the
registered advantage estimators (``adv_estimator``: gae, grpo, rloo, reinforce_pp,
reinforce_pp_baseline, remax, verl's spellings of them, and verl's gdpo, grpo_passk, opo, gpg,
optimal_token_baseline, tir_optimal_token_baseline; ``realrl.impl.model.utils.advantages`` and
``advantages_verl``) and policy losses
(``policy_loss``: verl's vanilla (= ppo), gspo, cispo, geo_mean, sapo, gpg, dro, dppo_tv, dppo_kl,
clip_cov, kl_cov, their ``policy_loss_options``; ``loss_agg_mode``; ``policy_losses*.py``), DAPO's
clip-higher (``eps_clip_high``) and overlong reward shaping, and GRPO's KL loss (``kl_loss_coef``).
docs/algorithms.md has the table of every option with its source.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from realrl.api.core.model_api import GenerationHyperparameters
from realrl.impl.interface.rollout_correction import RolloutCorrectionConfig
from realrl.impl.model.utils.policy_loss_options import PolicyLossOptions
from realrl.impl.model.utils.rl_registry import (
    AGGREGATIONS,
    PolicyLossConfig,
    adv_estimator_names,
    get_adv_estimator,
    policy_loss_names,
)


def real_generation_defaults() -> GenerationHyperparameters:
    """ReaL's PPO sampling defaults: top_p 0.9, top_k 200, temperature 1."""
    return GenerationHyperparameters(max_new_tokens=256, top_p=0.9, top_k=200, temperature=1.0)


@dataclasses.dataclass
class PPOHyperparameters:
    gen: GenerationHyperparameters = dataclasses.field(default_factory=real_generation_defaults)
    # ReaL's command-line names for gen.top_p and gen.top_k (``ppo.top_p=0.9 ppo.top_k=1000``):
    # when set they replace the sampling options
    top_p: float | None = None
    top_k: int | None = None
    temperature_scale_logprobs: bool = True
    # multi-turn rollouts with an environment (the experiment's ``env``): at most max_turns model
    # turns per trajectory, each up to gen.max_new_tokens; max_total_tokens bounds everything after
    # the prompt (the model's turns and the observations); None: only the turns bound it
    max_turns: int = 1
    max_total_tokens: int | None = None

    # rejection sampling (PPO detail 5): truncate at the first truncate_token at response
    # position >= truncate_after; a response without one gets score = truncate_penalty
    truncate_token: Any = None  # a token id or its text (hydra has no int | str union)
    truncate_after: int = 0
    truncate_penalty: float | None = None
    missing_eos_penalty: float | None = None  # score -= penalty when the response has no EOS
    mask_no_eos_with_zero: bool = False  # score = 0 when the response has no EOS

    # the score
    reward_output_scaling: float = 1.0
    reward_output_bias: float = 0.0
    max_reward_clip: float | None = 20.0
    reward_whiten: bool = False
    # DAPO's overlong reward shaping: over the last overlong_buffer_ratio of gen.max_new_tokens
    # (DAPO: 4096 of 20480, 0.2) a response loses up to overlong_penalty, linearly (None: off)
    overlong_buffer_ratio: float | None = None
    overlong_penalty: float = 1.0

    # KL penalty in the reward
    kl_ctl: float = 0.1
    kl_estimator: str = "k1"  # k1 | k2 | k3 (str: hydra has no Literal)
    adaptive_kl_ctl: bool = False
    adaptive_kl_target: float = 6.0
    adaptive_kl_horizon: float = 10000.0
    # the reference policy's log-probs (one more model and forward a step) only where a KL term
    # reads them, as TRL (beta=0) and verl (use_kl_loss, use_kl_in_reward) skip it; true computes
    # them anyway for the ref_kl statistic
    monitor_ref_kl: bool = False

    # advantages
    adv_estimator: str = "gae"  # a registered estimator (docs/algorithms.md lists them)
    discount: float = 1.0
    gae_lambda: float = 1.0
    bootstrap_no_eos: bool = True  # a response cut by the length limit bootstraps from its last value
    adv_norm: bool = True
    whiten_scope: str = "batch"  # batch | minibatch
    grpo_scale_by_std: bool = True  # verl's norm_adv_by_std_in_grpo (grpo, grpo_passk, gdpo)
    # GDPO: the scores (the graph's score keys, e.g. rewards, env_rewards) normalised one by one
    # and their weights (verl's names; None: the summed score alone, weights all 1)
    gdpo_reward_keys: list[str] | None = None
    gdpo_reward_weights: list[float] | None = None
    kl_loss_coef: float = 0.0  # GRPO: + coef * k3 KL(pi || pi_ref) in the actor loss

    # optimisation
    ppo_n_epochs: int = 1
    ppo_n_minibatches: int = 4
    eps_clip: float = 0.2  # the low clip (1 - eps_clip); also the high one unless eps_clip_high
    eps_clip_high: float | None = None  # DAPO's clip-higher: 1 + eps_clip_high (e.g. 0.28)
    dual_clip: float | None = None  # dual-clip constant c > 1 for negative advantages
    policy_loss: str = "ppo"  # a registered policy loss (verl's names; docs/algorithms.md)
    policy_loss_options: PolicyLossOptions = dataclasses.field(default_factory=PolicyLossOptions)
    # AReaL's decoupled objective for samples from an older policy (asynchronous RL): the clip
    # anchored at the policy the step starts from, the behaviour policy's samples reweighted by
    # pi_prox / pi_behav (capped: tokens above the cap drop out). None: on when async_rl is
    decoupled_loss: bool | None = None
    behav_imp_weight_cap: float | None = None
    # the trainer's log-probs of the batch, one no-grad forward before the updates: the old
    # (proximal) policy, and the rollout_corr/* mismatch against the decoder's; on whenever a
    # rollout correction is (outside its bypass_mode). The correction: rollout_correction.py
    recompute_logprobs: bool = False
    rollout_correction: RolloutCorrectionConfig = dataclasses.field(default_factory=RolloutCorrectionConfig)
    # benchmark-only, a deliberate train/rollout mismatch (benchmarks/bench_rollout_correction.py):
    # plain generation samples, and records log-probs, at this temperature; the trainer scores at
    # gen.temperature (env/agent rollouts and partial rollouts ignore it)
    mismatch_decode_temperature: float | None = None
    # R3 router replay (a Mixture-of-Experts actor): the decoder records each token's experts and
    # the actor's forwards of the batch route there (router_replay.py); sets gen.record_experts
    router_replay: bool = False
    # token-mean | seq-mean-token-sum | seq-mean-token-mean | seq-mean-token-sum-norm (Dr. GRPO)
    loss_agg_mode: str = "token-mean"
    loss_norm_const: float | None = None  # seq-mean-token-sum-norm's divisor; default gen.max_new_tokens
    value_eps_clip: float | None = 0.2
    early_stop_imp_ratio: float | None = 5.0
    early_stop_kl: float | None = None
    value_norm: bool = True
    value_norm_beta: float = 0.99995
    shuffle_seed: int = 1
    log_samples: int = 4  # prompts whose answers and rewards go to samples.jsonl each step

    def __post_init__(self) -> None:
        if isinstance(self.gen, dict):
            self.gen = GenerationHyperparameters(**self.gen)
        if isinstance(self.policy_loss_options, dict):
            self.policy_loss_options = PolicyLossOptions(**self.policy_loss_options)
        if isinstance(self.rollout_correction, dict):
            self.rollout_correction = RolloutCorrectionConfig(**self.rollout_correction)
        if self.router_replay and not self.gen.record_experts:
            self.gen = dataclasses.replace(self.gen, record_experts=True)
        if self.top_p is not None or self.top_k is not None:
            self.gen = dataclasses.replace(
                self.gen,
                top_p=self.gen.top_p if self.top_p is None else self.top_p,
                top_k=self.gen.top_k if self.top_k is None else self.top_k,
            )
        estimators, losses = adv_estimator_names(), policy_loss_names()
        checks = [
            (self.adv_estimator in estimators, f"adv_estimator must be one of {estimators}"),
            (self.policy_loss in losses, f"policy_loss must be one of {losses}"),
            (self.loss_agg_mode in AGGREGATIONS, f"loss_agg_mode must be one of {list(AGGREGATIONS)}"),
            (
                self.overlong_buffer_ratio is None or 0 < self.overlong_buffer_ratio <= 1,
                "overlong_buffer_ratio must be in (0, 1]",
            ),
            (self.kl_estimator in ("k1", "k2", "k3"), "kl_estimator must be 'k1', 'k2' or 'k3'"),
            (self.whiten_scope in ("batch", "minibatch"), "whiten_scope must be 'batch' or 'minibatch'"),
            (self.ppo_n_epochs >= 1, "ppo_n_epochs must be >= 1"),
            (self.max_turns >= 1, "max_turns must be >= 1"),
            (self.max_total_tokens is None or self.max_total_tokens >= 1, "max_total_tokens must be >= 1"),
            (self.ppo_n_minibatches >= 1, "ppo_n_minibatches must be >= 1"),
            (0 < self.eps_clip, "eps_clip must be > 0"),
            (
                0 <= self.discount <= 1 and 0 <= self.gae_lambda <= 1,
                "discount and gae_lambda must be in [0, 1]",
            ),
            (self.truncate_after >= 0, "truncate_after must be >= 0"),
            (
                self.mismatch_decode_temperature is None or self.mismatch_decode_temperature > 0,
                "mismatch_decode_temperature must be > 0",
            ),
            (self.kl_ctl >= 0 and self.kl_loss_coef >= 0, "kl_ctl and kl_loss_coef must be >= 0"),
            (
                self.adv_estimator not in estimators  # named by the first check
                or self.estimator.kl_in_reward
                or (self.kl_ctl == 0 and not self.adaptive_kl_ctl),
                f"adv_estimator={self.adv_estimator!r} puts the KL in the loss: set kl_ctl=0 and use kl_loss_coef",
            ),
            (
                self.gdpo_reward_weights is None
                or (
                    self.gdpo_reward_keys is not None
                    and len(self.gdpo_reward_weights) == len(self.gdpo_reward_keys)
                ),
                "gdpo_reward_weights needs gdpo_reward_keys, one weight per key",
            ),
            (
                self.gdpo_reward_keys is None
                or (
                    len(self.gdpo_reward_keys) > 0
                    and len(set(self.gdpo_reward_keys)) == len(self.gdpo_reward_keys)
                ),
                "gdpo_reward_keys must name distinct score keys (or be None)",
            ),
            (
                self.truncate_penalty is None or self.truncate_token is not None,
                "truncate_penalty needs truncate_token",
            ),
        ]
        for ok, msg in checks:
            if not ok:
                raise ValueError(f"PPOHyperparameters: {msg} (got {self._brief()})")
        self.loss_config()  # checks the clip values
        self.policy_loss_options.check_for(self.policy_loss, self.eps_clip)

    @property
    def estimator(self):
        """The registered advantage estimator ``adv_estimator`` names."""
        return get_adv_estimator(self.adv_estimator)

    @property
    def uses_critic(self) -> bool:
        return self.estimator.needs_critic

    @property
    def uses_reference(self) -> bool:
        """Whether the graph computes the reference policy's log-probs: a KL penalty in the reward
        (fixed, or adaptive from any start), a KL loss, or ``monitor_ref_kl``."""
        return bool(self.kl_ctl or self.adaptive_kl_ctl or self.kl_loss_coef or self.monitor_ref_kl)

    @property
    def clip_high(self) -> float:
        return self.eps_clip if self.eps_clip_high is None else self.eps_clip_high

    @property
    def decoder_gen(self) -> GenerationHyperparameters:
        """What plain generation samples with: ``gen``, or at ``mismatch_decode_temperature``."""
        t = self.mismatch_decode_temperature
        return self.gen if t is None else dataclasses.replace(self.gen, temperature=t)

    def loss_config(self) -> PolicyLossConfig:
        return PolicyLossConfig(self.eps_clip, self.clip_high, self.dual_clip, self.policy_loss_options)

    def norm_const(self) -> float:
        """Dr. GRPO's constant normaliser: the generation length limit unless set."""
        return float(self.loss_norm_const or self.gen.max_new_tokens)

    def _brief(self) -> str:
        fields = (
            "adv_estimator",
            "kl_estimator",
            "whiten_scope",
            "ppo_n_epochs",
            "ppo_n_minibatches",
            "eps_clip",
        )
        return ", ".join(f"{f}={getattr(self, f)!r}" for f in fields) + f", kl_ctl={self.kl_ctl}"


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


def make_ppo_hyperparameters(
    ppo: PPOHyperparameters | dict[str, Any] | None = None, preset: str | None = None
) -> PPOHyperparameters:
    """``ppo`` itself when it is a ``PPOHyperparameters`` (complete and validated where it was made:
    what the experiments hand their interfaces); else ``preset`` (a name of ``PRESETS``; "real" =
    the defaults) overridden by ``ppo`` (a dict of fields; ``gen`` may itself be a dict that
    overrides the preset's sampling)."""
    if isinstance(ppo, PPOHyperparameters):
        return ppo
    if preset is not None and preset not in PRESETS:
        raise ValueError(f"unknown PPO preset {preset!r}; choose from {sorted(PRESETS)}")
    values = PRESETS[preset or "real"]()
    overrides = dict(ppo or {})
    known = {f.name for f in dataclasses.fields(PPOHyperparameters)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(f"unknown PPO option(s) {unknown}; known: {sorted(known)}")
    gen_override = overrides.pop("gen", None)
    values.update(overrides)
    if gen_override is not None:
        base = values.get("gen") or real_generation_defaults()
        if isinstance(gen_override, GenerationHyperparameters):
            values["gen"] = gen_override
        else:
            values["gen"] = dataclasses.replace(base, **dict(gen_override))
    return PPOHyperparameters(**values)
