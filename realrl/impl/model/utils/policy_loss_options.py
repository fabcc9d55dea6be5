"""The options of the policy losses beyond the clip range, under the names verl's config uses.

verl keeps them in ``actor.policy_loss`` (clip_cov_*, kl_cov_ratio, ppo_kl_coef, dro_beta) and
``actor`` (tau_pos, tau_neg); here they are ``ppo.policy_loss_options.<name>``. The clip range
itself (verl's clip_ratio_low / clip_ratio_high / clip_ratio_c) is ``ppo.eps_clip``,
``ppo.eps_clip_high`` and ``ppo.dual_clip``. Defaults are verl's. Imports no torch.
"""

from __future__ import annotations

import dataclasses

# losses whose surrogate clips the ratio at 1 - eps_clip_low: a bound <= 0 would switch PPO's
# pessimism off for negative advantages (cispo reads eps_clip_low >= 1 as "no lower bound")
RATIO_CLIP_LOSSES = ("ppo", "vanilla", "gspo", "clip_cov")


@dataclasses.dataclass
class PolicyLossOptions:
    """What each loss reads (docs/algorithms.md has the table):

    clip_cov  clip_cov_ratio: the fraction of response tokens whose gradient is cut, drawn among
              those with covariance cov(A, logp) in (clip_cov_lb, clip_cov_ub).
    kl_cov    kl_cov_ratio: the fraction of response tokens (largest covariance) that get the
              penalty ppo_kl_coef * |logp - logp_old|.
    sapo      tau_pos / tau_neg: the gate's temperature for tokens with A > 0 / A <= 0.
    dro       dro_beta: the weight of the quadratic penalty (logp - logp_old)^2 / 2; required.
    """

    clip_cov_ratio: float = 0.0002
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0
    kl_cov_ratio: float = 0.0002
    ppo_kl_coef: float = 0.1
    tau_pos: float = 1.0
    tau_neg: float = 1.05
    dro_beta: float | None = None

    def __post_init__(self) -> None:
        checks = [
            (0 < self.clip_cov_ratio <= 1, "clip_cov_ratio must be in (0, 1]"),
            (self.clip_cov_lb < self.clip_cov_ub, "clip_cov_lb must be < clip_cov_ub"),
            (0 < self.kl_cov_ratio <= 1, "kl_cov_ratio must be in (0, 1]"),
            (self.ppo_kl_coef >= 0, "ppo_kl_coef must be >= 0"),
            (self.tau_pos > 0 and self.tau_neg > 0, "tau_pos and tau_neg must be > 0"),
            (self.dro_beta is None or self.dro_beta > 0, "dro_beta must be > 0 (or None)"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ValueError(f"PolicyLossOptions: {msg} (got {self})")

    def check_for(self, policy_loss: str, eps_clip_low: float) -> None:
        """What ``policy_loss`` needs: ``dro`` a ``dro_beta`` (it has no default), the losses of
        ``RATIO_CLIP_LOSSES`` a lower clip ``eps_clip_low`` < 1."""
        if policy_loss == "dro" and self.dro_beta is None:
            raise ValueError("policy_loss='dro' needs policy_loss_options.dro_beta > 0 (e.g. 0.05)")
        if policy_loss in RATIO_CLIP_LOSSES and not eps_clip_low < 1:
            raise ValueError(f"policy_loss={policy_loss!r} needs eps_clip < 1, got {eps_clip_low}")
