"""The rollout correction's math on packed batches of unequal lengths against verl's
``rollout_corr_helper.py`` formulas written out here in its padded [B, L] layout."""

from __future__ import annotations

import math

import pytest
import torch

from realrl.impl.interface.rollout_correction import ROLLOUT_RS_OPTIONS, RolloutCorrectionConfig
from realrl.impl.model.utils import ppo_functional as F
from realrl.impl.model.utils.rollout_correction import (
    importance_weights,
    offpolicy_metrics,
    rejection_mask,
    rollout_correction,
)

# answers of 3, 1, 6, 2 and 0 response tokens after prompts of 2, 4, 1, 3 and 2 tokens
PROMPTS, RESPONSES = [2, 4, 1, 3, 2], [3, 1, 6, 2, 0]


def packed_batch(seed: int = 0, scale: float = 0.5):
    """(train, rollout log-probs [T - N], loss mask, short_cu_seqlens): prompt targets hold junk
    that the mask must hide; one answer's log ratio is 25 (past verl's bound of 20)."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.cat([torch.tensor([False] * (p - 1) + [True] * r) for p, r in zip(PROMPTS, RESPONSES)])
    cu = torch.tensor([0] + [p + r for p, r in zip(PROMPTS, RESPONSES)]).cumsum(0)
    rollout = -torch.rand(mask.shape[0], generator=g) * 3
    train = rollout + torch.randn(mask.shape[0], generator=g) * scale
    train = torch.where(mask, train, torch.full_like(train, 7.0))
    train[int(F.short_cu_seqlens(cu)[2]) + 3] = rollout[int(F.short_cu_seqlens(cu)[2]) + 3] + 25.0
    return train, rollout, mask, F.short_cu_seqlens(cu)


def padded(x, mask, short_cu):
    """verl's layout: each answer's response entries left-aligned in a row ([B, L], mask [B, L])."""
    rows = [
        x[short_cu[i] : short_cu[i + 1]][mask[short_cu[i] : short_cu[i + 1]]]
        for i in range(len(short_cu) - 1)
    ]
    grid, pmask = torch.zeros(len(rows), max(RESPONSES)), torch.zeros(len(rows), max(RESPONSES))
    for i, r in enumerate(rows):
        grid[i, : len(r)], pmask[i, : len(r)] = r, 1.0
    return grid, pmask


def unpadded(grid, mask, short_cu):
    out = torch.zeros(mask.shape[0])
    for i in range(len(short_cu) - 1):
        idx = torch.arange(int(short_cu[i]), int(short_cu[i + 1]))[mask[short_cu[i] : short_cu[i + 1]]]
        out[idx] = grid[i, : len(idx)]
    return out


# ----------------------------------------------------------------------------- verl's formulas


def mmean(v, m, axis=None):
    s = (
        (torch.where(m.bool(), v, 0.0) * m).sum()
        if axis is None
        else (torch.where(m.bool(), v, 0.0) * m).sum(axis)
    )
    return s / ((m.sum() if axis is None else m.sum(axis)) + 1e-8)


def msum(v, m, axis):
    return (torch.where(m.bool(), v, 0.0) * m).sum(axis)


def verl_offpolicy(old, roll, m):
    mt, mr = mmean(old, m, -1), mmean(roll, m, -1)
    lr = old - roll
    d = mr - mt
    return {
        "training_ppl": torch.exp(-mt).mean(),
        "training_log_ppl": (-mt).mean(),
        "kl": mmean(roll - old, m),
        "k3_kl": mmean(torch.exp(lr) - lr - 1, m),
        "rollout_ppl": torch.exp(-mr).mean(),
        "rollout_log_ppl": (-mr).mean(),
        "log_ppl_diff": d.mean(),
        "log_ppl_abs_diff": d.abs().mean(),
        "log_ppl_diff_max": d.max(),
        "log_ppl_diff_min": d.min(),
        "ppl_ratio": torch.exp(d).mean(),
        "chi2_token": mmean(torch.exp(lr.clamp(-20, 20)).square(), m) - 1.0,
        "chi2_seq": torch.exp(2.0 * msum(lr, m, -1).clamp(-20, 20)).mean() - 1.0,
        "log_ratio_abs_mean": mmean(lr.abs(), m),
        "log_ratio_abs_max": lr[m.bool()].abs().max(),
    }


def verl_is_weights(lr, m, level, thr, normalize):
    if level == "token":
        w = torch.exp(lr.clamp(-20, 20))
    else:
        w = torch.exp(msum(lr, m, -1).unsqueeze(-1).clamp(-20, 20)).expand_as(lr)
    w = (w * m).clamp(max=thr)
    if normalize:
        if level == "token":
            mean = mmean(w, m)
        else:
            seq_mask = (m.sum(-1) > 0).float()
            mean = (mmean(w, m, -1) * seq_mask).sum() / seq_mask.sum().clamp_min(1e-8)
        w = w / mean
    return w


def verl_rs_keep(lr, m, option, lower, upper):
    """Per token 1 = kept, for one verl filter (k1 bounds given as ratios)."""
    s = lr.clamp(-20, 20)
    k = {"k1": -s, "k2": 0.5 * s**2, "k3": torch.exp(s) - 1.0 - s}[option[-2:]]
    level = option[:-3]
    if level == "seq_sum":
        k = msum(k, m, -1).unsqueeze(-1).expand_as(m)
    elif level == "seq_mean":
        k = mmean(k, m, -1).unsqueeze(-1).expand_as(m)
    elif level == "seq_max":
        mx = k.masked_fill(~m.bool(), float("-inf")).max(-1).values
        k = torch.where(mx == float("-inf"), 0.0, mx).unsqueeze(-1).expand_as(m)
    if option.endswith("k1"):
        return ((k >= math.log(lower)) & (k <= math.log(upper))).float()
    return (k <= upper).float()


# ----------------------------------------------------------------------------- tests


def test_offpolicy_metrics_equal_verls():
    train, rollout, mask, short_cu = packed_batch()
    got = offpolicy_metrics(train, rollout, mask, short_cu)
    ref = verl_offpolicy(
        *padded(train, mask, short_cu)[:1],
        padded(rollout, mask, short_cu)[0],
        padded(train, mask, short_cu)[1],
    )
    assert set(got) == set(ref)
    for k, v in ref.items():
        assert got[k] == pytest.approx(float(v), rel=1e-5, abs=1e-6), k
    assert got["log_ratio_abs_max"] == pytest.approx(25.0, rel=1e-5)


def test_identical_policies_measure_no_mismatch():
    _, rollout, mask, short_cu = packed_batch()
    got = offpolicy_metrics(rollout.clone(), rollout, mask, short_cu)
    for k in (
        "kl",
        "k3_kl",
        "log_ratio_abs_mean",
        "log_ratio_abs_max",
        "chi2_token",
        "chi2_seq",
        "log_ppl_diff",
    ):
        assert got[k] == pytest.approx(0.0, abs=1e-6), k
    assert got["ppl_ratio"] == pytest.approx(1.0)


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("threshold", [2.0, 1.3])
def test_importance_weights_equal_verls_and_carry_no_gradient(level, normalize, threshold):
    train, rollout, mask, short_cu = packed_batch(seed=1)
    train.requires_grad_(True)
    lr = train - rollout
    w, stats = importance_weights(lr, mask, short_cu, level, threshold, normalize)
    assert not w.requires_grad
    plr, pm = padded(lr.detach(), mask, short_cu)
    ref = unpadded(verl_is_weights(plr, pm, level, threshold, normalize), mask, short_cu)
    torch.testing.assert_close(w, ref, rtol=1e-5, atol=1e-6)
    assert (w[~mask] == 0).all()
    assert (w[mask] <= threshold + 1e-6).all() or normalize
    if normalize:
        assert "rollout_is_batch_norm_factor" in stats
    assert stats["rollout_is_mean"] == pytest.approx(
        float(mmean(verl_is_weights(plr, pm, level, threshold, False), pm)), rel=1e-5
    )


def test_sequence_weights_are_constant_within_an_answer():
    train, rollout, mask, short_cu = packed_batch(seed=2, scale=0.05)
    w, _ = importance_weights(train - rollout, mask, short_cu, "sequence", 100.0)
    for i in range(len(short_cu) - 1):
        row = w[short_cu[i] : short_cu[i + 1]][mask[short_cu[i] : short_cu[i + 1]]]
        if row.numel():
            assert torch.allclose(row, row[0].expand_as(row))


def _bounds(option, spec):
    if option.endswith("k1"):
        lo, _, up = spec.partition("_")
        return (float(lo), float(up)) if up else (1.0 / float(lo), float(lo))
    return None, float(spec)


RS_CASES = [(o, "1.5") for o in ROLLOUT_RS_OPTIONS if not o.endswith("k1")] + [
    (o, s) for o in ROLLOUT_RS_OPTIONS if o.endswith("k1") for s in ("1.5", "0.8_1.6")
]


@pytest.mark.parametrize("option,spec", RS_CASES)
def test_each_rejection_filter_equals_verls(option, spec):
    train, rollout, mask, short_cu = packed_batch(seed=3, scale=0.3)
    rules = RolloutCorrectionConfig(rollout_rs=option, rollout_rs_threshold=spec).rejection_rules()
    kept, stats = rejection_mask(train - rollout, mask, short_cu, rules)
    plr, pm = padded(train - rollout, mask, short_cu)
    ref = unpadded(verl_rs_keep(plr, pm, option, *_bounds(option, spec)) * pm, mask, short_cu).bool()
    assert torch.equal(kept, ref)
    assert stats["rollout_rs_masked_fraction"] == pytest.approx(1 - float(ref.sum()) / float(mask.sum()))
    assert 0 < int(kept.sum()) < int(mask.sum()) or option.startswith("seq_max") or option == "token_k2"


def test_sequence_filters_drop_whole_answers():
    train, rollout, mask, short_cu = packed_batch(seed=4, scale=0.3)
    rules = RolloutCorrectionConfig(rollout_rs="seq_mean_k3", rollout_rs_threshold=0.02).rejection_rules()
    kept, _ = rejection_mask(train - rollout, mask, short_cu, rules)
    for i in range(len(short_cu) - 1):
        rows = kept[short_cu[i] : short_cu[i + 1]][mask[short_cu[i] : short_cu[i + 1]]]
        assert rows.all() or not rows.any()


def test_filters_combine_by_and_and_the_correction_reports_with_prefix():
    train, rollout, mask, short_cu = packed_batch(seed=5, scale=0.3)
    cfg = RolloutCorrectionConfig(
        rollout_is="token", rollout_rs="token_k1,seq_max_k3", rollout_rs_threshold="0.7_1.4,2.0"
    )
    weights, kept, stats = rollout_correction(
        train, rollout, mask, short_cu, "token", 2.0, False, cfg.rejection_rules()
    )
    plr, pm = padded(train - rollout, mask, short_cu)
    ref = verl_rs_keep(plr, pm, "token_k1", 0.7, 1.4) * verl_rs_keep(plr, pm, "seq_max_k3", None, 2.0) * pm
    assert torch.equal(kept, unpadded(ref, mask, short_cu).bool())
    torch.testing.assert_close(
        weights, unpadded(verl_is_weights(plr, pm, "token", 2.0, False), mask, short_cu)
    )
    assert all(k.startswith("rollout_corr/") for k in stats)
    assert {
        "rollout_corr/kl",
        "rollout_corr/k3_kl",
        "rollout_corr/ppl_ratio",
        "rollout_corr/chi2_token",
    } <= set(stats)
    assert "rollout_corr/rollout_rs_token_k1_masked_fraction" in stats


def test_options_check_names_and_thresholds():
    rules = RolloutCorrectionConfig(
        rollout_rs="token_k1,seq_sum_k2", rollout_rs_threshold="2.0"
    ).rejection_rules()
    assert [(r.level, r.estimator) for r in rules] == [("token", "k1"), ("seq_sum", "k2")]
    assert rules[0].upper == pytest.approx(math.log(2.0)) and rules[0].lower == pytest.approx(-math.log(2.0))
    assert rules[1].upper == 2.0 and rules[1].lower is None
    assert RolloutCorrectionConfig(rollout_is="none").rollout_is is None
    assert not RolloutCorrectionConfig().enabled
    with pytest.raises(ValueError, match="token_k1.*seq_max_k3"):
        RolloutCorrectionConfig(rollout_rs="token_k9", rollout_rs_threshold=1.0)
    with pytest.raises(ValueError, match="rollout_is='tokens'.*'token', 'sequence'"):
        RolloutCorrectionConfig(rollout_is="tokens")
    with pytest.raises(ValueError, match="needs rollout_rs_threshold"):
        RolloutCorrectionConfig(rollout_rs="token_k3")
    with pytest.raises(ValueError, match="one upper bound"):
        RolloutCorrectionConfig(rollout_rs="token_k3", rollout_rs_threshold="0.1_2")
    with pytest.raises(ValueError, match="one per filter"):
        RolloutCorrectionConfig(rollout_rs="token_k3,token_k2", rollout_rs_threshold="1,2,3")
    with pytest.raises(ValueError, match="bypass_mode"):
        RolloutCorrectionConfig(rollout_is="token", bypass_mode=True)
    with pytest.raises(ValueError, match="> 0"):
        RolloutCorrectionConfig(rollout_is="token", rollout_is_threshold=0.0)
