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
reward_output_scaling / _bias, value_norm, early_stop_imp_ratio / early_stop_kl (ReaL), and GRPO
(adv_estimator="grpo", kl_loss_coef).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from realrl.api.core.model_api import GenerationHyperparameters


def real_generation_defaults() -> GenerationHyperparameters:
    """ReaL's PPO sampling defaults: top_p 0.9, top_k 200, temperature 1."""
    return GenerationHyperparameters(max_new_tokens=256, top_p=0.9, top_k=200, temperature=1.0)


@dataclasses.dataclass
class PPOHyperparameters:
    gen: GenerationHyperparameters = dataclasses.field(default_factory=real_generation_defaults)
    temperature_scale_logprobs: bool = True

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

    # KL penalty in the reward
    kl_ctl: float = 0.1
    kl_estimator: str = "k1"  # k1 | k2 | k3 (str: hydra has no Literal)
    adaptive_kl_ctl: bool = False
    adaptive_kl_target: float = 6.0
    adaptive_kl_horizon: float = 10000.0

    # advantages
    adv_estimator: str = "gae"  # gae | grpo
    discount: float = 1.0
    gae_lambda: float = 1.0
    bootstrap_no_eos: bool = True  # a response cut by the length limit bootstraps from its last value
    adv_norm: bool = True
    whiten_scope: str = "batch"  # batch | minibatch
    grpo_scale_by_std: bool = True
    kl_loss_coef: float = 0.0  # GRPO: + coef * k3 KL(pi || pi_ref) in the actor loss

    # optimisation
    ppo_n_epochs: int = 1
    ppo_n_minibatches: int = 4
    eps_clip: float = 0.2
    value_eps_clip: float | None = 0.2
    early_stop_imp_ratio: float | None = 5.0
    early_stop_kl: float | None = None
    value_norm: bool = True
    value_norm_beta: float = 0.99995
    shuffle_seed: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.gen, dict):
            self.gen = GenerationHyperparameters(**self.gen)
        checks = [
            (self.adv_estimator in ("gae", "grpo"), "adv_estimator must be 'gae' or 'grpo'"),
            (self.kl_estimator in ("k1", "k2", "k3"), "kl_estimator must be 'k1', 'k2' or 'k3'"),
            (self.whiten_scope in ("batch", "minibatch"), "whiten_scope must be 'batch' or 'minibatch'"),
            (self.ppo_n_epochs >= 1, "ppo_n_epochs must be >= 1"),
            (self.ppo_n_minibatches >= 1, "ppo_n_minibatches must be >= 1"),
            (0 < self.eps_clip, "eps_clip must be > 0"),
            (
                0 <= self.discount <= 1 and 0 <= self.gae_lambda <= 1,
                "discount and gae_lambda must be in [0, 1]",
            ),
            (self.truncate_after >= 0, "truncate_after must be >= 0"),
            (self.kl_ctl >= 0 and self.kl_loss_coef >= 0, "kl_ctl and kl_loss_coef must be >= 0"),
            (
                self.adv_estimator == "gae" or (self.kl_ctl == 0 and not self.adaptive_kl_ctl),
                "adv_estimator='grpo' puts the KL in the loss: set kl_ctl=0 and use kl_loss_coef",
            ),
            (
                self.truncate_penalty is None or self.truncate_token is not None,
                "truncate_penalty needs truncate_token",
            ),
        ]
        for ok, msg in checks:
            if not ok:
                raise ValueError(f"PPOHyperparameters: {msg} (got {self._brief()})")

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


def grpo_preset() -> dict[str, Any]:
    """GRPO (DeepSeekMath): 4 answers per prompt, group-normalised advantages, no critic, no KL
    in the reward, k3 KL to the reference in the loss with coefficient 0.04."""
    gen = real_generation_defaults()
    gen.n = 4
    return dict(
        gen=gen,
        adv_estimator="grpo",
        kl_ctl=0.0,
        adaptive_kl_ctl=False,
        kl_loss_coef=0.04,
        adv_norm=False,
        value_norm=False,
        ppo_n_minibatches=1,
    )


PRESETS = {"real": dict, "lm_human_preferences": lm_human_preferences_preset, "grpo": grpo_preset}


def make_ppo_hyperparameters(
    ppo: PPOHyperparameters | dict[str, Any] | None = None, preset: str | None = None
) -> PPOHyperparameters:
    """``preset`` ("real" = the defaults, "lm_human_preferences", "grpo") overridden by ``ppo``
    (a dict of fields; ``gen`` may itself be a dict that overrides the preset's sampling)."""
    if isinstance(ppo, PPOHyperparameters):
        if preset is not None:
            raise ValueError("give either a PPOHyperparameters instance or a preset name, not both")
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
