"""Options of the rollout correction (``ppo.rollout_correction``), by verl's names, without torch.

The decoder that samples the answers and the trainer that updates the policy compute log-probs
of the same tokens differently (kernels, precision, batch shapes), so the answers are slightly
off-policy even in synchronous training, and training can collapse unless this is corrected
("When Speed Kills Stability: Demystifying RL Collapse from the Training-Inference Mismatch",
Yao et al. 2025; verl's ``rollout_corr_helper.py``). With r_t = pi_train(y_t) / pi_rollout(y_t):

  rollout_is             none | token | sequence: truncated importance weights on the policy loss,
                         w_t = min(r_t, threshold) or, for a whole answer, min(prod_t r_t, threshold)
  rollout_is_threshold   the truncation (verl's TIS), > 0
  rollout_is_batch_normalize   divide the weights by their batch mean (tokens, or answers)
  rollout_rs             rejection: comma-separated filters of ``ROLLOUT_RS_OPTIONS``, every one must
                         pass; token_* drop tokens, seq_* drop whole answers from the loss mask
  rollout_rs_threshold   one bound per filter, or one for all (comma-separated). k2 / k3 filters: an
                         upper bound on the divergence. k1 filters: bounds on the ratio, "lower_upper"
                         or one number u meaning [1 / u, u], compared (as verl does) with -log r
  bypass_mode            no recomputation: the rollout's log-probs stay the old policy, rejection is
                         decided in the loss against the current policy, and no importance weight
                         is applied (the clipped ratio already is pi_theta / pi_rollout)

The math is ``realrl.impl.model.utils.rollout_correction``; the actor
(``ppo_actor.PPOActorInterface``) applies it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

ROLLOUT_IS_LEVELS = ("token", "sequence")
# verl's rejection filters: <level>_<estimator>, level token | seq_sum | seq_mean | seq_max
ROLLOUT_RS_OPTIONS = (
    "token_k1",
    "token_k2",
    "token_k3",
    "seq_sum_k1",
    "seq_sum_k2",
    "seq_sum_k3",
    "seq_mean_k1",
    "seq_mean_k2",
    "seq_mean_k3",
    "seq_max_k2",
    "seq_max_k3",
)


@dataclasses.dataclass(frozen=True)
class RejectionRule:
    """One parsed rejection filter: keep where ``lower <= statistic <= upper`` (``lower`` None:
    no lower bound). ``level``: token | seq_sum | seq_mean | seq_max; ``estimator``: k1 | k2 | k3;
    a k1 filter's bounds are the logs of its ratio bounds."""

    option: str
    level: str
    estimator: str
    upper: float
    lower: float | None


def _none_if_off(value: str | None) -> str | None:
    return None if value is None or str(value).strip().lower() in ("", "none", "null") else str(value)


def _rule(option: str, spec: str) -> RejectionRule:
    level, _, estimator = option.rpartition("_")
    try:
        if estimator == "k1":
            lower_text, sep, upper_text = spec.partition("_")
            upper = float(upper_text if sep else lower_text)
            lower = float(lower_text) if sep else 1.0 / upper
        elif "_" in spec:
            raise ValueError(f"a {estimator} filter takes one upper bound, not 'lower_upper'")
        else:
            upper, lower = float(spec), None
    except (ValueError, ZeroDivisionError) as e:
        raise ValueError(f"rollout_rs_threshold {spec!r} for {option}: {e}") from None
    if upper <= 0 or (lower is not None and lower <= 0):
        raise ValueError(f"rollout_rs_threshold {spec!r} for {option}: bounds must be > 0")
    if estimator == "k1":
        return RejectionRule(option, level, estimator, math.log(upper), math.log(lower))
    return RejectionRule(option, level, estimator, upper, None)


@dataclasses.dataclass
class RolloutCorrectionConfig:
    rollout_is: str | None = None  # none | token | sequence
    rollout_is_threshold: float = 2.0
    rollout_is_batch_normalize: bool = False
    rollout_rs: str | None = None  # e.g. "token_k3" or "token_k1,seq_mean_k3"
    rollout_rs_threshold: Any = None  # a number, or a string: "0.5_2.0", "2.0,0.01"
    bypass_mode: bool = False

    def __post_init__(self) -> None:
        self.rollout_is = _none_if_off(self.rollout_is)
        self.rollout_rs = _none_if_off(self.rollout_rs)
        if self.rollout_is is not None and self.rollout_is not in ROLLOUT_IS_LEVELS:
            raise ValueError(
                f"ppo.rollout_correction.rollout_is={self.rollout_is!r}: choose none or one of {ROLLOUT_IS_LEVELS}"
            )
        if not self.rollout_is_threshold > 0:
            raise ValueError(
                f"ppo.rollout_correction.rollout_is_threshold must be > 0, got {self.rollout_is_threshold}"
            )
        if self.bypass_mode and self.rollout_is is not None:
            raise ValueError(
                "ppo.rollout_correction.bypass_mode keeps the rollout's log-probs as the old policy, so the "
                "clipped ratio already is pi_theta / pi_rollout: rollout_is would count it twice (use rollout_rs)"
            )
        self.rejection_rules()  # names and thresholds checked where they are given

    @property
    def enabled(self) -> bool:
        return self.rollout_is is not None or self.rollout_rs is not None

    def rejection_rules(self) -> list[RejectionRule]:
        """The parsed ``rollout_rs`` filters (none when off), in the order given, without repeats."""
        if self.rollout_rs is None:
            return []
        options = list(dict.fromkeys(o.strip() for o in self.rollout_rs.split(",") if o.strip()))
        unknown = [o for o in options if o not in ROLLOUT_RS_OPTIONS]
        if unknown or not options:
            raise ValueError(
                f"ppo.rollout_correction.rollout_rs={self.rollout_rs!r}: unknown filter(s) {unknown}; "
                f"choose from {list(ROLLOUT_RS_OPTIONS)} (comma-separated)"
            )
        if self.rollout_rs_threshold is None:
            raise ValueError("ppo.rollout_correction.rollout_rs needs rollout_rs_threshold")
        specs = [s.strip() for s in str(self.rollout_rs_threshold).split(",") if s.strip()]
        if len(specs) not in (1, len(options)):
            raise ValueError(
                f"ppo.rollout_correction.rollout_rs_threshold={self.rollout_rs_threshold!r}: give one "
                f"bound for all filters or one per filter ({len(options)})"
            )
        specs = specs * len(options) if len(specs) == 1 else specs
        return [_rule(o, s) for o, s in zip(options, specs)]
