"""The policy losses verl registers beyond PPO and GSPO (cispo, gpg, dro, dppo_tv, dppo_kl,
geo_mean, sapo, clip_cov, kl_cov): each against its formula written out on padded [B, L] batches
(as verl computes it), values and gradients, on packed answers of unequal lengths; and the
limits where one loss equals another."""

from __future__ import annotations

import math

import pytest
import torch

from realrl.impl.model.utils import ppo_functional as F
from realrl.impl.model.utils.policy_loss_options import PolicyLossOptions
from realrl.impl.model.utils.policy_losses import PolicyLossConfig, aggregate_loss, get_policy_loss

PROMPTS, ANSWERS = [1, 2, 1, 3, 1, 2], [3, 2, 4, 2, 3, 1]


def batch(seed: int, scale: float = 0.3):
    """Packed (logp [T - N] requiring grad, old, adv, mask, short_cu) of six answers of unequal
    lengths, each behind a prompt; log-probs in (-3, 0) and log ratios of about ``scale``."""
    g = torch.Generator().manual_seed(seed)
    lens = [p + r for p, r in zip(PROMPTS, ANSWERS)]
    short_cu = F.short_cu_seqlens(torch.tensor([0] + lens).cumsum(0))
    mask = torch.cat([torch.tensor([False] * (p - 1) + [True] * r) for p, r in zip(PROMPTS, ANSWERS)])
    n = mask.shape[0]
    old = -0.05 - torch.rand(n, generator=g) * 2.5
    logp = (old + scale * torch.randn(n, generator=g)).clamp(max=-1e-3).requires_grad_(True)
    return logp, old, torch.randn(n, generator=g), mask, short_cu


def pad(x: torch.Tensor, mask: torch.Tensor, short_cu: torch.Tensor):
    """The response tokens of each answer as rows of [B, L] (zeros after the end), and the mask;
    differentiable in x."""
    rows = [
        x[short_cu[i] : short_cu[i + 1]][mask[short_cu[i] : short_cu[i + 1]]]
        for i in range(len(short_cu) - 1)
    ]
    grid, rmask = torch.zeros(len(rows), max(map(len, rows))), torch.zeros(len(rows), max(map(len, rows)))
    for i, r in enumerate(rows):
        grid[i, : len(r)], rmask[i, : len(r)] = r, 1.0
    return grid, rmask


def mmean(x, m):
    return (x * m).sum() / m.sum()


def check(name, cfg, reference, seed=0, scale=0.3, mode="token-mean"):
    """Our per-token loss equals ``reference(old, logp, adv, rmask)`` (padded) on the response
    tokens, and the aggregated losses have the same value and gradient. Returns our stats."""
    logp, old, adv, mask, short_cu = batch(seed, scale)
    ours, stats = get_policy_loss(name)(logp, old, adv, mask, short_cu, cfg)
    p_logp, rmask = pad(logp, mask, short_cu)
    p_old, p_adv = pad(old, mask, short_cu)[0], pad(adv, mask, short_cu)[0]
    ref_tokens, ref_scalar = reference(p_old, p_logp, p_adv, rmask)
    torch.testing.assert_close(pad(ours, mask, short_cu)[0] * rmask, ref_tokens * rmask)
    agg = aggregate_loss(ours, mask, short_cu, mode)
    torch.testing.assert_close(agg, ref_scalar)
    (g_ours,) = torch.autograd.grad(agg, logp)
    (g_ref,) = torch.autograd.grad(ref_scalar, logp)
    torch.testing.assert_close(g_ours, g_ref)
    assert g_ours[~mask].abs().sum() == 0 and g_ours[mask].abs().sum() > 0
    return stats


def ratio_of(old, logp):
    return torch.exp(torch.clamp(logp - old, -20.0, 20.0))


# ----------------------------------------------------------------------------- against the formulas


def test_vanilla_is_ppo():
    assert get_policy_loss("vanilla") is get_policy_loss("ppo")


@pytest.mark.parametrize("low, high", [(10.0, 0.2), (0.1, 0.15)])
def test_cispo(low, high):
    def ref(old, logp, adv, m):
        ratio = ratio_of(old, logp)
        w = ratio.clamp(1 - low, 1 + high).detach()
        tok = -w * adv * logp
        return tok, mmean(tok, m)

    stats = check("cispo", PolicyLossConfig(low, high), ref)
    logp, old, _, mask, _ = batch(0)
    r = torch.exp(logp - old).detach()[mask]
    expected = ((r > 1 + high) | (r < 1 - low)).float().mean()
    torch.testing.assert_close(stats["clip_frac"], expected)
    assert 0 < float(expected) < 1


def test_gpg():
    stats = check("gpg", PolicyLossConfig(), lambda old, logp, adv, m: (-adv * logp, mmean(-adv * logp, m)))
    assert float(stats["clip_frac"]) == 0


def test_dro_and_its_required_beta():
    beta = 0.3

    def ref(old, logp, adv, m):
        tok = -(logp * adv - 0.5 * beta * (logp - old) ** 2)
        return tok, mmean(tok, m)

    check("dro", PolicyLossConfig(options=PolicyLossOptions(dro_beta=beta)), ref, scale=1.0)
    logp, old, adv, mask, short_cu = batch(0)
    with pytest.raises(ValueError, match="dro_beta"):
        get_policy_loss("dro")(logp, old, adv, mask, short_cu, PolicyLossConfig())
    with pytest.raises(ValueError, match="dro_beta"):
        PolicyLossOptions(dro_beta=0.0)


def dppo_reference(valid_fn, cap):
    def ref(old, logp, adv, m):
        ratio = ratio_of(old, logp)
        valid = valid_fn(old, logp, adv).detach().float()
        tok = -adv * torch.clamp(ratio, max=cap).detach() * logp * valid
        return tok, mmean(tok, m)

    return ref


def test_dppo_tv():
    low, high, cap = 0.05, 0.08, 1.3

    def valid(old, logp, adv):
        diff = torch.exp(logp) - torch.exp(old)
        return torch.where(adv > 0, diff <= high, diff >= -low)

    stats = check(
        "dppo_tv", PolicyLossConfig(low, high, dual_clip=cap), dppo_reference(valid, cap), scale=0.6
    )
    assert 0 < float(stats["clip_frac"]) < 1 and 0 < float(stats["truncated_frac"]) < 1


def test_dppo_kl():
    low, high, cap = 0.025, 0.05, 1.3

    def valid(old, logp, adv):
        p, q = torch.exp(logp), torch.exp(old)
        kl = q * (old - logp) + (1 - q) * torch.log((1 - q + 1e-8) / (1 - p + 1e-8))
        return torch.where(adv > 0, (kl <= high) | (p <= q), (kl <= low) | (p >= q))

    stats = check(
        "dppo_kl", PolicyLossConfig(low, high, dual_clip=cap), dppo_reference(valid, cap), scale=0.6
    )
    assert 0 < float(stats["clip_frac"]) < 1 and float(stats["truncated_frac"]) > 0


def test_dppo_default_cap_is_20():
    """Unset dual_clip: the weight is min(r, 20)."""
    short_cu, mask = torch.tensor([0, 1]), torch.tensor([True])
    logp = torch.tensor([-0.1], requires_grad=True)
    cfg = PolicyLossConfig(0.99, 0.99)
    loss, st = get_policy_loss("dppo_tv")(
        logp, torch.tensor([-4.0]), torch.tensor([-1.0]), mask, short_cu, cfg
    )
    loss.sum().backward()
    assert float(logp.grad[0]) == pytest.approx(20.0) and float(st["truncated_frac"]) == 1.0


def test_geo_mean():
    low, high = 0.1, 0.15

    def ref(old, logp, adv, m):
        x = logp - old
        sgn = torch.sign(adv)
        x_min = sgn * torch.min(sgn * x, sgn * torch.clamp(x, -low, high))
        n = m.sum(-1)
        seq_ratio = torch.exp((x_min * m).sum(-1) / (n + 1e-8))
        seq_adv = (adv * m).sum(-1) / (n + 1e-8)
        per_seq = -seq_adv * seq_ratio
        return per_seq[:, None].expand_as(m), per_seq.mean()

    stats = check("geo_mean", PolicyLossConfig(low, high), ref, mode="seq-mean-token-mean")
    logp, old, adv, mask, _ = batch(0)
    x = (logp - old).detach()[mask]
    out = (x < -low) | (x > high)
    torch.testing.assert_close(stats["clip_frac"], (out & (adv[mask] > 0)).float().mean())
    torch.testing.assert_close(stats["clip_frac_lower"], (out & (adv[mask] < 0)).float().mean())
    assert float(stats["clip_frac"]) > 0 and float(stats["clip_frac_lower"]) > 0


def test_sapo():
    tau_pos, tau_neg = 1.0, 1.5

    def ref(old, logp, adv, m):
        ratio = ratio_of(old, logp)
        tau = torch.where(adv > 0, torch.tensor(tau_pos), torch.tensor(tau_neg))
        tok = -torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau) * adv
        per_seq = (tok * m).sum(-1) / m.sum(-1)
        return tok, per_seq.mean()

    cfg = PolicyLossConfig(options=PolicyLossOptions(tau_pos=tau_pos, tau_neg=tau_neg))
    check("sapo", cfg, ref, scale=1.0, mode="seq-mean-token-mean")


def test_clip_cov_cuts_every_candidate_when_allowed():
    """clip_cov_ratio = 1 allows all: every candidate (not PPO-clipped, covariance inside
    (lb, ub)) loses its gradient."""
    lb, ub = 0.1, 5.0

    def ref(old, logp, adv, m):
        ratio = torch.exp(logp - old)
        l1, l2 = -adv * ratio, -adv * torch.clamp(ratio, 0.8, 1.2)
        cov = (adv - mmean(adv, m)) * (logp.detach() - mmean(logp.detach(), m))
        cut = (m > 0) & ~(l2 > l1) & (cov > lb) & (cov < ub)
        tok = torch.maximum(l1, l2) * (~cut).float()
        return tok, mmean(tok, m)

    opts = PolicyLossOptions(clip_cov_ratio=1.0, clip_cov_lb=lb, clip_cov_ub=ub)
    stats = check("clip_cov", PolicyLossConfig(0.2, 0.2, options=opts), ref, scale=0.5)
    assert 0 < float(stats["clip_frac"]) < 1 and 0 < float(stats["ppo_clip_frac"]) < 1


def test_clip_cov_draws_its_share_among_the_candidates():
    logp, old, adv, mask, short_cu = batch(1)
    opts = PolicyLossOptions(clip_cov_ratio=0.15, clip_cov_lb=-1e9, clip_cov_ub=1e9)
    cfg = PolicyLossConfig(5.0, 5.0, options=opts)  # nothing PPO-clipped: every token a candidate
    torch.manual_seed(0)
    loss, stats = get_policy_loss("clip_cov")(logp, old, adv, mask, short_cu, cfg)
    n_resp = int(mask.sum())
    cut = mask & (loss == 0) & (adv != 0)
    assert int(cut.sum()) == max(int(0.15 * n_resp), 1) == 2
    assert float(stats["clip_frac"]) == pytest.approx(2 / n_resp)


def test_kl_cov():
    ratio_k, coef = 0.25, 0.7

    def ref(old, logp, adv, m):
        ratio = torch.exp(logp - old)
        valid = m > 0
        a, lp = adv[valid], logp.detach()[valid]
        cov = (a - a.mean()) * (lp - lp.mean())
        k = max(1, int(len(cov) * ratio_k))
        flat = torch.zeros(valid.sum().item())
        flat[torch.topk(cov, k).indices] = 1.0
        top = torch.zeros_like(m)
        top[valid] = flat
        tok = -adv * ratio + coef * (logp - old).abs() * top
        return tok, mmean(tok, m)

    opts = PolicyLossOptions(kl_cov_ratio=ratio_k, ppo_kl_coef=coef)
    stats = check("kl_cov", PolicyLossConfig(options=opts), ref)
    assert float(stats["kl_cov_frac"]) == pytest.approx(int(15 * ratio_k) / 15)
    assert float(stats["abs_kl"]) > 0


# ----------------------------------------------------------------------------- limits


def grad_of(name, cfg, logp, old, adv, mask, short_cu, mode="token-mean"):
    loss, _ = get_policy_loss(name)(logp, old, adv, mask, short_cu, cfg)
    value = aggregate_loss(loss, mask, short_cu, mode)
    (g,) = torch.autograd.grad(value, logp)
    return value, g


WIDE = PolicyLossConfig(10.0, 100.0)  # no clip binds: vanilla is -A * r


@pytest.mark.parametrize("name", ["dppo_tv", "dppo_kl", "cispo"])
def test_weighted_likelihoods_have_unclipped_ppo_gradients_at_wide_bounds(name):
    """sg[w] * logp with w = r has the gradient of r: -A * r * grad logp."""
    data = batch(2, scale=0.5)
    _, g_ppo = grad_of("vanilla", WIDE, *data)
    cfg = PolicyLossConfig(10.0, 100.0, dual_clip=1e6)
    _, g = grad_of(name, cfg, *data)
    torch.testing.assert_close(g, g_ppo)


def test_on_policy_limits():
    """At logp = logp_old: dro = gpg (value and gradient), and sapo, cispo and vanilla have
    gpg's gradient (f'(1) = 1, w = 1)."""
    logp, old, adv, mask, short_cu = batch(3)
    old = logp.detach().clone()
    cfg = PolicyLossConfig(options=PolicyLossOptions(dro_beta=0.5))
    v_gpg, g_gpg = grad_of("gpg", cfg, logp, old, adv, mask, short_cu)
    v_dro, g_dro = grad_of("dro", cfg, logp, old, adv, mask, short_cu)
    torch.testing.assert_close((v_dro, g_dro), (v_gpg, g_gpg))
    for name in ("sapo", "cispo", "vanilla"):
        torch.testing.assert_close(grad_of(name, cfg, logp, old, adv, mask, short_cu)[1], g_gpg)


def test_geo_mean_of_one_token_answers_is_vanilla_with_the_log_bounds():
    """One token per answer: exp(clip in log space) = PPO with eps_high = e^hi - 1, eps_low = 1 - e^-lo."""
    short_cu, mask = torch.tensor([0, 1, 2, 3, 4]), torch.ones(4, dtype=torch.bool)
    logp = torch.tensor([-0.5, -1.0, -0.2, -2.0], requires_grad=True)
    old = torch.tensor([-0.8, -0.6, -0.25, -1.5])
    adv = torch.tensor([1.0, -2.0, 0.5, 1.5])
    low, high = 0.2, 0.25
    mode = "seq-mean-token-mean"
    ppo_cfg = PolicyLossConfig(1 - math.exp(-low), math.exp(high) - 1)
    v_geo, g_geo = grad_of("geo_mean", PolicyLossConfig(low, high), logp, old, adv, mask, short_cu, mode)
    v_ppo, g_ppo = grad_of("vanilla", ppo_cfg, logp, old, adv, mask, short_cu, mode)
    torch.testing.assert_close((v_geo, g_geo), (v_ppo, g_ppo))
    assert (g_ppo == 0).sum() == 2  # two tokens clipped: the limit is not trivial


def test_kl_cov_without_penalty_and_clip_cov_without_candidates_are_vanilla():
    data = batch(4, scale=0.5)
    no_penalty = PolicyLossConfig(10.0, 100.0, options=PolicyLossOptions(ppo_kl_coef=0.0, kl_cov_ratio=0.5))
    torch.testing.assert_close(grad_of("kl_cov", no_penalty, *data), grad_of("vanilla", WIDE, *data))
    none_inside = PolicyLossConfig(0.2, 0.2, options=PolicyLossOptions(clip_cov_lb=1e6, clip_cov_ub=1e7))
    ppo = PolicyLossConfig(0.2, 0.2)
    torch.testing.assert_close(grad_of("clip_cov", none_inside, *data), grad_of("vanilla", ppo, *data))


# ----------------------------------------------------------------------------- options


@pytest.mark.parametrize(
    "bad",
    [
        {"clip_cov_ratio": 0.0},
        {"clip_cov_lb": 5.0, "clip_cov_ub": 1.0},
        {"kl_cov_ratio": 1.5},
        {"ppo_kl_coef": -0.1},
        {"tau_neg": 0.0},
        {"dro_beta": -1.0},
    ],
)
def test_options_are_validated(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        PolicyLossOptions(**bad)


def test_no_lower_clip_is_allowed_but_not_a_negative_one():
    assert PolicyLossConfig(eps_clip_low=10.0).eps_clip_low == 10.0
    with pytest.raises(ValueError, match="eps_clip_low"):
        PolicyLossConfig(eps_clip_low=-0.1)
