"""The registries of advantage estimators and policy losses, by name, without their math.

An experiment checks the names it is given and reads an estimator's needs (a critic? a greedy
baseline? a KL in the reward?) when it builds its graph, in the master, which imports no torch.
The math lives in ``advantages`` and ``policy_losses``; a built-in entry names its function as
``"module:function"`` and imports it on first use, in a worker. A plugin registers a function
itself (``register_adv_estimator`` / ``register_policy_loss``, re-exported by those modules).
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from typing import Any

from realrl.base.registry import Registry
from realrl.impl.model.utils.policy_loss_options import PolicyLossOptions

_ADVANTAGES = "realrl.impl.model.utils.advantages"
_ADVANTAGES_VERL = "realrl.impl.model.utils.advantages_verl"
_LOSSES = "realrl.impl.model.utils.policy_losses"
_PG_LOSSES = "realrl.impl.model.utils.policy_losses_pg"
_SHAPED_LOSSES = "realrl.impl.model.utils.policy_losses_shaped"

# how ``aggregate_loss`` may reduce a per-token loss to a scalar (policy_losses.aggregate_loss)
AGGREGATIONS = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def _resolve(ref: Callable | str) -> Callable:
    if callable(ref):
        return ref
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


@dataclasses.dataclass(frozen=True)
class AdvantageEstimator:
    """A registered estimator and what its caller must provide.

    ``fn(inputs) -> (advantages [T - N], returns [T - N])``, zero off the mask (a function, or a
    ``"module:function"`` reference imported on first call). ``needs_critic``: reads ``values`` /
    ``bootstrap``; ``needs_baseline``: reads ``baseline_scores`` (a greedy rollout's score);
    ``kl_in_reward``: a KL penalty in the reward (kl_ctl > 0) is meaningful (False for GRPO,
    which puts the KL in the loss instead). ``needs_logprobs``: reads ``old_logprobs`` (the
    rollout's per-token log-probs); ``needs_reward_components``: reads ``reward_components`` (the
    scores ``gdpo_reward_keys`` names, one row each). The caller fills an input only for an
    estimator that declares it.
    """

    name: str
    fn: Callable[[Any], tuple[Any, Any]] | str
    needs_critic: bool = False
    needs_baseline: bool = False
    kl_in_reward: bool = True
    needs_logprobs: bool = False
    needs_reward_components: bool = False

    def __call__(self, inputs: Any) -> tuple[Any, Any]:
        return _resolve(self.fn)(inputs)


_ESTIMATORS: Registry[AdvantageEstimator] = Registry("advantage estimator")


def register_adv_estimator(
    name: str,
    fn: Callable[[Any], tuple[Any, Any]] | str,
    *,
    needs_critic: bool = False,
    needs_baseline: bool = False,
    kl_in_reward: bool = True,
    needs_logprobs: bool = False,
    needs_reward_components: bool = False,
) -> AdvantageEstimator:
    """Register ``fn`` under ``name`` (a plain call, not a decorator); returns the entry."""
    if not (callable(fn) or (isinstance(fn, str) and ":" in fn)):
        raise TypeError(f"advantage estimator {name!r} must be callable or 'module:function', got {fn!r}")
    est = AdvantageEstimator(
        name, fn, needs_critic, needs_baseline, kl_in_reward, needs_logprobs, needs_reward_components
    )
    return _ESTIMATORS.register(name, est)


def get_adv_estimator(name: str) -> AdvantageEstimator:
    """The estimator registered as ``name``; an unknown name's error lists the registered ones."""
    return _ESTIMATORS.get(name)


def adv_estimator_names() -> list[str]:
    return _ESTIMATORS.names()


_POLICY_LOSSES: Registry[Callable | str] = Registry("policy loss")


def register_policy_loss(name: str, fn: Callable | str) -> Callable | str:
    """Register ``fn`` (or a ``"module:function"`` reference) under ``name``; returns it."""
    if not (callable(fn) or (isinstance(fn, str) and ":" in fn)):
        raise TypeError(f"policy loss {name!r} must be callable or 'module:function', got {fn!r}")
    return _POLICY_LOSSES.register(name, fn)


def get_policy_loss(name: str) -> Callable:
    """The loss registered as ``name``; an unknown name's error lists the registered ones."""
    return _resolve(_POLICY_LOSSES.get(name))


def policy_loss_names() -> list[str]:
    return _POLICY_LOSSES.names()


@dataclasses.dataclass
class PolicyLossConfig:
    """Clip range [1 - eps_clip_low, 1 + eps_clip_high] of the importance ratio (verl's
    ``clip_ratio_low`` / ``clip_ratio_high``), and the other losses' ``options``.

    ``eps_clip_high > eps_clip_low`` is DAPO's clip-higher (e.g. 0.2 / 0.28): a token whose
    probability rises under a positive advantage may rise further before it stops learning.
    ``eps_clip_low >= 1`` puts no lower bound on the ratio (CISPO's choice). ``dual_clip`` = c > 1
    bounds the loss of a negative-advantage token by -A * c however large its ratio grows (verl's
    ``clip_ratio_c``, typically 3; DPPO's cap on its importance weight). ``geo_mean`` clips the log
    ratio to [-eps_clip_low, eps_clip_high]; ``dppo_tv`` / ``dppo_kl`` read the pair as divergence
    thresholds.
    """

    eps_clip_low: float = 0.2
    eps_clip_high: float = 0.2
    dual_clip: float | None = None
    options: PolicyLossOptions = dataclasses.field(default_factory=PolicyLossOptions)

    def __post_init__(self):
        if self.eps_clip_low < 0:
            raise ValueError(f"eps_clip_low must be >= 0, got {self.eps_clip_low}")
        if self.eps_clip_high < 0:
            raise ValueError(f"eps_clip_high must be >= 0, got {self.eps_clip_high}")
        if self.dual_clip is not None and not self.dual_clip > 1:
            raise ValueError(f"dual_clip must be > 1 (or None), got {self.dual_clip}")


# the built-in entries (their papers: the docstrings of ``advantages`` and ``policy_losses``)
register_adv_estimator("gae", f"{_ADVANTAGES}:gae_advantages", needs_critic=True)
register_adv_estimator("grpo", f"{_ADVANTAGES}:grpo_advantages", kl_in_reward=False)
register_adv_estimator("rloo", f"{_ADVANTAGES}:rloo_advantages")
register_adv_estimator("reinforce_pp", f"{_ADVANTAGES}:reinforce_pp_advantages")
register_adv_estimator("reinforce_pp_baseline", f"{_ADVANTAGES}:reinforce_pp_baseline_advantages")
register_adv_estimator("remax", f"{_ADVANTAGES}:remax_advantages", needs_baseline=True)
# verl's spellings of the same math (its AdvantageEstimator enum; the *_vectorized ones are its
# loop-free versions of grpo and rloo)
register_adv_estimator("reinforce_plus_plus", f"{_ADVANTAGES}:reinforce_pp_advantages")
register_adv_estimator("reinforce_plus_plus_baseline", f"{_ADVANTAGES}:reinforce_pp_baseline_advantages")
register_adv_estimator("grpo_vectorized", f"{_ADVANTAGES}:grpo_advantages", kl_in_reward=False)
register_adv_estimator("rloo_vectorized", f"{_ADVANTAGES}:rloo_advantages")
# verl's other estimators (advantages_verl); the group-std-normalised ones keep the KL in the loss
register_adv_estimator(
    "gdpo", f"{_ADVANTAGES_VERL}:gdpo_advantages", kl_in_reward=False, needs_reward_components=True
)
register_adv_estimator("grpo_passk", f"{_ADVANTAGES_VERL}:grpo_passk_advantages", kl_in_reward=False)
register_adv_estimator("opo", f"{_ADVANTAGES_VERL}:opo_advantages")
register_adv_estimator("gpg", f"{_ADVANTAGES_VERL}:gpg_advantages")
register_adv_estimator(
    "optimal_token_baseline", f"{_ADVANTAGES_VERL}:optimal_token_baseline_advantages", needs_logprobs=True
)
register_adv_estimator(
    "tir_optimal_token_baseline",
    f"{_ADVANTAGES_VERL}:tir_optimal_token_baseline_advantages",
    needs_logprobs=True,
)
# verl's names (``core_algos.py``); ``ppo`` is ``vanilla``'s older name here
register_policy_loss("vanilla", f"{_LOSSES}:ppo_policy_loss")
register_policy_loss("ppo", f"{_LOSSES}:ppo_policy_loss")
register_policy_loss("gspo", f"{_LOSSES}:gspo_policy_loss")
register_policy_loss("cispo", f"{_PG_LOSSES}:cispo_policy_loss")
register_policy_loss("gpg", f"{_PG_LOSSES}:gpg_policy_loss")
register_policy_loss("dro", f"{_PG_LOSSES}:dro_policy_loss")
register_policy_loss("dppo_tv", f"{_PG_LOSSES}:dppo_tv_policy_loss")
register_policy_loss("dppo_kl", f"{_PG_LOSSES}:dppo_kl_policy_loss")
register_policy_loss("geo_mean", f"{_SHAPED_LOSSES}:geo_mean_policy_loss")
register_policy_loss("sapo", f"{_SHAPED_LOSSES}:sapo_policy_loss")
register_policy_loss("clip_cov", f"{_SHAPED_LOSSES}:clip_cov_policy_loss")
register_policy_loss("kl_cov", f"{_SHAPED_LOSSES}:kl_cov_policy_loss")
