"""Every PPO / GRPO option in one dataclass, with ReaL's defaults; named presets (``ppo_presets``).

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
from realrl.impl.interface.ppo_presets import PRESETS, real_generation_defaults
from realrl.impl.interface.rollout_correction import RolloutCorrectionConfig
from realrl.impl.model.utils.policy_loss_options import PolicyLossOptions
from realrl.impl.model.utils.rl_registry import (
    AGGREGATIONS,
    PolicyLossConfig,
    adv_estimator_names,
    get_adv_estimator,
    policy_loss_names,
)


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
