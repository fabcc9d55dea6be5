"""Policy losses (PPO with clip-higher and dual clip, GSPO) and loss aggregation."""

from __future__ import annotations

import math

import pytest
import torch

from realrl.base.registry import UnknownNameError
from realrl.impl.model.utils import ppo_functional as F
from realrl.impl.model.utils.policy_losses import (
    AGGREGATIONS,
    PolicyLossConfig,
    aggregate_loss,
    aggregation_weight,
    get_policy_loss,
    policy_loss_names,
    register_policy_loss,
)


def reference_actor_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    eps_clip: float,
    loss_mask: torch.Tensor,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The clipped surrogate as realrl computed it before the policy-loss registry (masked mean):

    ratio = exp(logp - logp_old);   L = mean( max(-A * ratio, -A * clip(ratio, 1 - eps, 1 + eps)) )
    Stats: the clipped fraction, the mean importance ratio, approx KL(old || new) = mean(logp_old - logp).
    """
    mask = loss_mask.bool()
    ratio = torch.where(mask, torch.exp(logprobs - old_logprobs), torch.zeros_like(logprobs))
    clipped_ratio = ratio.clamp(1.0 - eps_clip, 1.0 + eps_clip)
    pg_loss1 = -advantages * ratio
    pg_loss2 = -advantages * clipped_ratio
    pg_loss = torch.max(pg_loss1, pg_loss2)
    loss = F.masked_mean(pg_loss, mask)
    stats = {
        "clip_frac": F.masked_mean((pg_loss2 > pg_loss1).float().detach(), mask),
        "importance_ratio": F.masked_mean(ratio.detach(), mask),
        "approx_kl": F.masked_mean((old_logprobs - logprobs).detach(), mask),
    }
    return loss, stats


def packing(prompt_lens: list[int], resp_lens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(short_cu_seqlens [N + 1], loss_mask [T - N]) of sequences of prompt + response tokens."""
    lens = [p + r for p, r in zip(prompt_lens, resp_lens)]
    cu = torch.tensor([0] + lens).cumsum(0)
    mask = torch.cat([torch.tensor([False] * (p - 1) + [True] * r) for p, r in zip(prompt_lens, resp_lens)])
    return F.short_cu_seqlens(cu), mask


def random_policy_batch(seed: int, log_ratio_scale: float = 0.3):
    g = torch.Generator().manual_seed(seed)
    short_cu, mask = packing([1, 2, 1, 3, 1, 2], [3, 2, 4, 2, 3, 1])
    n = mask.shape[0]
    old = -torch.rand(n, generator=g) * 3
    logp = (old + log_ratio_scale * torch.randn(n, generator=g)).requires_grad_(True)
    adv = torch.randn(n, generator=g)
    return logp, old, adv, mask, short_cu


def one_token(log_ratio: float, advantage: float, cfg: PolicyLossConfig, name: str = "ppo"):
    """(loss, d loss / d logp, stats) of a single response token."""
    short_cu, mask = packing([1], [1])
    logp = torch.tensor([log_ratio], requires_grad=True)
    loss, stats = get_policy_loss(name)(logp, torch.zeros(1), torch.tensor([advantage]), mask, short_cu, cfg)
    loss.sum().backward()
    return float(loss[0].detach()), float(logp.grad[0]), stats


# ----------------------------------------------------------------------------- PPO


def test_ppo_equals_actor_loss_per_token():
    logp, old, adv, mask, short_cu = random_policy_batch(0)
    cfg = PolicyLossConfig(eps_clip_low=0.2, eps_clip_high=0.2)
    loss, stats = get_policy_loss("ppo")(logp, old, adv, mask, short_cu, cfg)
    assert (loss[~mask] == 0).all()
    clipped = 0
    for j in mask.nonzero().flatten().tolist():  # actor_loss over a mask of one token = that token's term
        only_j = torch.zeros_like(mask)
        only_j[j] = True
        ref, _ = reference_actor_loss(logp.detach(), old, adv, 0.2, only_j)
        torch.testing.assert_close(loss[j].detach(), ref)
        ratio = math.exp(float(logp[j].detach() - old[j]))
        clipped += abs(ratio - 1) > 0.2
    assert 0 < clipped < int(mask.sum())  # both sides of the clip are exercised
    ref_loss, ref_stats = reference_actor_loss(logp, old, adv, 0.2, mask)
    ours = aggregate_loss(loss, mask, short_cu, "token-mean")
    torch.testing.assert_close(ours, ref_loss)
    for key in ("clip_frac", "importance_ratio", "approx_kl"):
        torch.testing.assert_close(stats[key], ref_stats[key])
    (g_ours,) = torch.autograd.grad(ours, logp)
    (g_ref,) = torch.autograd.grad(ref_loss, logp)
    torch.testing.assert_close(g_ours, g_ref)


def test_clip_higher_is_asymmetric():
    symmetric = PolicyLossConfig(eps_clip_low=0.2, eps_clip_high=0.2)
    higher = PolicyLossConfig(eps_clip_low=0.2, eps_clip_high=0.28)
    # ratio 1.25, A > 0: clipped at 1.2 by the symmetric range (no gradient), not by 0.28
    loss, grad, stats = one_token(math.log(1.25), 1.0, symmetric)
    assert loss == pytest.approx(-1.2) and grad == 0.0 and float(stats["clip_frac"]) == 1.0
    loss, grad, stats = one_token(math.log(1.25), 1.0, higher)
    assert loss == pytest.approx(-1.25) and grad == pytest.approx(-1.25) and float(stats["clip_frac"]) == 0.0
    # the lower side is unchanged: ratio 0.75, A < 0 is clipped at 0.8 by both
    for cfg in (symmetric, higher):
        loss, grad, _ = one_token(math.log(0.75), -1.0, cfg)
        assert loss == pytest.approx(0.8) and grad == 0.0
    # and a wider lower range lets it through
    loss, grad, _ = one_token(math.log(0.75), -1.0, PolicyLossConfig(eps_clip_low=0.28, eps_clip_high=0.2))
    assert loss == pytest.approx(0.75) and grad == pytest.approx(0.75)


def test_dual_clip_bounds_negative_advantages_only():
    short_cu, mask = packing([1], [4])
    ratios = torch.tensor([5.0, 2.0, 5.0, 0.5])
    adv = torch.tensor([-1.0, -1.0, 1.0, -1.0])
    for c, expected, frac in [(None, [5.0, 2.0, -1.2, 0.8], 0.0), (3.0, [3.0, 2.0, -1.2, 0.8], 0.25)]:
        logp = ratios.log().requires_grad_(True)
        cfg = PolicyLossConfig(dual_clip=c)
        loss, stats = get_policy_loss("ppo")(logp, torch.zeros(4), adv, mask, short_cu, cfg)
        torch.testing.assert_close(loss.detach(), torch.tensor(expected))
        assert float(stats["dual_clip_frac"]) == frac
        loss.sum().backward()
        # d(-A r)/d logp = -A r where the unclipped term is chosen; 0 where a constant is
        torch.testing.assert_close(logp.grad, torch.tensor([0.0 if c else 5.0, 2.0, 0.0, 0.0]))


def test_config_validation():
    with pytest.raises(ValueError, match="dual_clip"):
        PolicyLossConfig(dual_clip=1.0)
    with pytest.raises(ValueError, match="eps_clip_low"):
        PolicyLossConfig(eps_clip_low=-0.1)  # >= 1 is allowed: no lower bound (CISPO)
    with pytest.raises(ValueError, match="eps_clip_high"):
        PolicyLossConfig(eps_clip_high=-0.1)


def verl_policy_loss(old_log_prob, log_prob, advantages, response_mask, low, high, clip_ratio_c):
    """verl's compute_policy_loss, padded [B, L], returning the per-token losses."""
    negative_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(negative_approx_kl)
    ppo_kl = verl_masked_mean(-negative_approx_kl, response_mask)
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - low, 1 + high)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    pg_clipfrac = verl_masked_mean(torch.gt(pg_losses2, pg_losses1).float(), response_mask)
    pg_losses3 = -advantages * clip_ratio_c
    clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)
    pg_clipfrac_lower = verl_masked_mean(
        torch.gt(clip_pg_losses1, pg_losses3) * (advantages < 0).float(), response_mask
    )
    pg_losses = torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)
    return pg_losses, pg_clipfrac, ppo_kl, pg_clipfrac_lower


def verl_masked_mean(x, mask):
    return (x * mask).sum() / mask.sum()


def padded(x, mask, short_cu):
    rows = [
        x[short_cu[i] : short_cu[i + 1]][mask[short_cu[i] : short_cu[i + 1]]]
        for i in range(len(short_cu) - 1)
    ]
    grid = torch.zeros(len(rows), max(len(r) for r in rows), dtype=x.dtype)
    rmask = torch.zeros_like(grid)
    for i, r in enumerate(rows):
        grid[i, : len(r)], rmask[i, : len(r)] = r, 1.0
    return grid, rmask


def test_ppo_matches_verl_with_clip_higher_and_dual_clip():
    logp, old, adv, mask, short_cu = random_policy_batch(1, log_ratio_scale=1.0)
    logp = logp.detach().clone()
    logp[1], adv[1] = old[1] + 2.0, -1.0  # ratio e^2 > c = 3 under a negative advantage
    cfg = PolicyLossConfig(eps_clip_low=0.2, eps_clip_high=0.28, dual_clip=3.0)
    loss, stats = get_policy_loss("ppo")(logp, old, adv, mask, short_cu, cfg)
    p = [padded(x, mask, short_cu)[0] for x in (old, logp, adv, loss)]
    rmask = padded(old, mask, short_cu)[1]
    ref, clipfrac, kl, lower = verl_policy_loss(p[0], p[1], p[2], rmask, 0.2, 0.28, 3.0)
    torch.testing.assert_close(p[3], ref * rmask)
    torch.testing.assert_close(stats["clip_frac"], clipfrac)
    torch.testing.assert_close(stats["approx_kl"], kl)
    torch.testing.assert_close(stats["dual_clip_frac"], lower)
    assert float(lower) > 0 and float(clipfrac) > 0


# ----------------------------------------------------------------------------- GSPO


def test_gspo_hand_numbers():
    short_cu, mask = packing([1, 1], [2, 3])
    logp = torch.tensor([0.1, 0.3, 1e-4, -1e-4, 0.0], requires_grad=True)
    adv = torch.tensor([1.0, 1.0, -2.0, -2.0, -2.0])
    cfg = PolicyLossConfig(eps_clip_low=3e-4, eps_clip_high=4e-4)
    loss, stats = get_policy_loss("gspo")(logp, torch.zeros(5), adv, mask, short_cu, cfg)
    # seq 0: s = exp(0.2) = 1.2214 > 1.0004: clipped, -A * 1.0004 on both tokens, no gradient;
    # seq 1: s = exp(0) = 1 (inside the range): loss -A * 1 = 2, gradient -A * s = 2 per token
    torch.testing.assert_close(loss.detach(), torch.tensor([-1.0004, -1.0004, 2.0, 2.0, 2.0]))
    loss.sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([0.0, 0.0, 2.0, 2.0, 2.0]))
    torch.testing.assert_close(stats["clip_frac"], torch.tensor(0.4))
    torch.testing.assert_close(stats["importance_ratio"], torch.tensor((2 * math.exp(0.2) + 3) / 5))


def test_gspo_equals_token_ppo_when_log_ratios_are_equal_within_each_sequence():
    _, old, adv, mask, short_cu = random_policy_batch(2)
    lens = (short_cu[1:] - short_cu[:-1]).long()
    per_seq = torch.tensor([0.5, -0.05, 0.1, -0.4, 0.0, 0.3])  # some outside the clip range, some in
    logp = (old + torch.repeat_interleave(per_seq, lens)).requires_grad_(True)
    cfg = PolicyLossConfig(eps_clip_low=0.2, eps_clip_high=0.28, dual_clip=3.0)
    results = {}
    for name in ("ppo", "gspo"):
        loss, stats = get_policy_loss(name)(logp, old, adv, mask, short_cu, cfg)
        (grad,) = torch.autograd.grad(aggregate_loss(loss, mask, short_cu, "token-mean"), logp)
        results[name] = (loss.detach(), grad, stats)
    torch.testing.assert_close(results["ppo"][0], results["gspo"][0])
    torch.testing.assert_close(results["ppo"][1], results["gspo"][1])
    for key in ("clip_frac", "importance_ratio", "approx_kl", "dual_clip_frac"):
        torch.testing.assert_close(results["ppo"][2][key], results["gspo"][2][key])
    assert 0 < float(results["ppo"][2]["clip_frac"]) < 1


def test_gspo_differs_from_token_ppo_when_log_ratios_differ():
    short_cu, mask = packing([1], [2])
    logp = torch.tensor([0.3, -0.3])
    adv = torch.ones(2)
    cfg = PolicyLossConfig()
    ppo, _ = get_policy_loss("ppo")(logp, torch.zeros(2), adv, mask, short_cu, cfg)
    gspo, _ = get_policy_loss("gspo")(logp, torch.zeros(2), adv, mask, short_cu, cfg)
    # PPO: ratio 1.35 is clipped to 1.2, ratio 0.74 stays; GSPO: the geometric mean is 1
    torch.testing.assert_close(ppo, torch.tensor([-1.2, -math.exp(-0.3)]))
    torch.testing.assert_close(gspo, torch.tensor([-1.0, -1.0]))


def test_gspo_gradient_is_the_sequence_level_objective_gradient():
    logp, old, _, mask, short_cu = random_policy_batch(3)
    lens = (short_cu[1:] - short_cu[:-1]).long()
    seq_adv = torch.tensor([1.0, -0.5, 2.0, -1.5, 0.7, -0.2])
    adv = torch.repeat_interleave(seq_adv, lens)
    cfg = PolicyLossConfig(eps_clip_low=0.1, eps_clip_high=0.1)
    loss, stats = get_policy_loss("gspo")(logp, old, adv, mask, short_cu, cfg)
    (grad,) = torch.autograd.grad(aggregate_loss(loss, mask, short_cu, "seq-mean-token-mean"), logp)
    # the sequence-level GSPO objective, one sequence at a time
    terms = []
    for i in range(len(lens)):
        sl = slice(int(short_cu[i]), int(short_cu[i + 1]))
        s = torch.exp((logp[sl] - old[sl])[mask[sl]].mean())
        terms.append(torch.max(-seq_adv[i] * s, -seq_adv[i] * s.clamp(0.9, 1.1)))
    (ref_grad,) = torch.autograd.grad(torch.stack(terms).mean(), logp)
    torch.testing.assert_close(grad, ref_grad)
    assert 0 < float(stats["clip_frac"]) < 1 and (grad != 0).sum() > 0


def verl_gspo(old_log_prob, log_prob, advantages, response_mask, low, high):
    """verl's compute_policy_loss_gspo, padded [B, L], returning the per-token losses."""
    negative_approx_kl = log_prob - old_log_prob
    seq_lengths = torch.sum(response_mask, dim=-1).clamp(min=1)
    negative_approx_kl_seq = torch.sum(negative_approx_kl * response_mask, dim=-1) / seq_lengths
    log_seq_importance_ratio = log_prob - log_prob.detach() + negative_approx_kl_seq.detach().unsqueeze(-1)
    log_seq_importance_ratio = torch.clamp(log_seq_importance_ratio, max=10.0)
    seq_importance_ratio = torch.exp(log_seq_importance_ratio)
    pg_losses1 = -advantages * seq_importance_ratio
    pg_losses2 = -advantages * torch.clamp(seq_importance_ratio, 1 - low, 1 + high)
    pg_losses = torch.maximum(pg_losses1, pg_losses2)
    pg_clipfrac = verl_masked_mean(torch.gt(pg_losses2, pg_losses1).float(), response_mask)
    return pg_losses, pg_clipfrac


def test_gspo_matches_verl():
    logp, old, adv, mask, short_cu = random_policy_batch(4, log_ratio_scale=0.001)
    logp = logp.detach()
    cfg = PolicyLossConfig(eps_clip_low=3e-4, eps_clip_high=4e-4)
    loss, stats = get_policy_loss("gspo")(logp, old, adv, mask, short_cu, cfg)
    p = [padded(x, mask, short_cu)[0] for x in (old, logp, adv, loss)]
    rmask = padded(old, mask, short_cu)[1]
    ref, clipfrac = verl_gspo(p[0], p[1], p[2], rmask, 3e-4, 4e-4)
    torch.testing.assert_close(p[3], ref * rmask)
    torch.testing.assert_close(stats["clip_frac"], clipfrac)
    assert 0 < float(clipfrac) < 1


# ----------------------------------------------------------------------------- aggregation


def small_loss():
    # seq 0: one prompt entry then two response tokens; seq 1: three response tokens;
    # seq 2: prompt only (no response token); off-mask entries hold junk, even NaN
    short_cu = torch.tensor([0, 3, 6, 8])
    mask = torch.tensor([False, True, True, True, True, True, False, False])
    loss = torch.tensor([9.0, 1.0, 2.0, 3.0, 6.0, 3.0, float("nan"), 7.0])
    return loss, mask, short_cu


@pytest.mark.parametrize(
    "mode,norm,expected,weight",
    [
        ("token-mean", None, (3 + 12) / 5, 5.0),
        ("seq-mean-token-sum", None, (3 + 12) / 2, 2.0),
        ("seq-mean-token-mean", None, (1.5 + 4) / 2, 2.0),
        ("seq-mean-token-sum-norm", 4.0, (3 / 4 + 12 / 4) / 2, 2.0),
    ],
)
def test_aggregation_hand_numbers(mode, norm, expected, weight):
    loss, mask, short_cu = small_loss()
    assert float(aggregate_loss(loss, mask, short_cu, mode, norm)) == pytest.approx(expected)
    assert aggregation_weight(mask, short_cu, mode) == weight


def test_aggregation_errors():
    loss, mask, short_cu = small_loss()
    with pytest.raises(ValueError, match="norm_const"):
        aggregate_loss(loss, mask, short_cu, "seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match="norm_const"):
        aggregate_loss(loss, mask, short_cu, "seq-mean-token-sum-norm", 0.0)
    with pytest.raises(ValueError, match="token-mean"):
        aggregate_loss(loss, mask, short_cu, "sum")
    with pytest.raises(ValueError, match="unknown loss aggregation"):
        aggregation_weight(mask, short_cu, "seq-sum")


def test_empty_batch_aggregates_to_zero():
    short_cu, mask = torch.tensor([0, 2]), torch.tensor([False, False])
    for mode in AGGREGATIONS:
        assert float(aggregate_loss(torch.ones(2), mask, short_cu, mode, 8.0)) == 0.0
        assert aggregation_weight(mask, short_cu, mode) == 0.0


def micro_batch(x, short_cu, a, b):
    """Sequences a..b-1 of a packed batch: their slice of x and their boundaries."""
    return x[int(short_cu[a]) : int(short_cu[b])], short_cu[a : b + 1] - short_cu[a]


@pytest.mark.parametrize("mode", AGGREGATIONS)
def test_weighted_micro_batches_recombine_to_the_whole_batch(mode):
    g = torch.Generator().manual_seed(5)
    short_cu, mask = packing([1, 2, 3, 1, 2, 1, 1], [3, 1, 0, 5, 2, 4, 2])  # seq 2 has no response
    loss = torch.randn(mask.shape[0], generator=g)
    whole = aggregate_loss(loss, mask, short_cu, mode, 8.0)
    splits = [(0, 2), (2, 3), (3, 4), (4, 7)]  # (2, 3) holds only the empty sequence
    parts, weights = [], []
    for a, b in splits:
        lo, cu_k = micro_batch(loss, short_cu, a, b)
        m_k, _ = micro_batch(mask, short_cu, a, b)
        parts.append(float(aggregate_loss(lo, m_k, cu_k, mode, 8.0)))
        weights.append(aggregation_weight(m_k, cu_k, mode))
    assert weights[1] == 0.0
    combined = sum(w * p for w, p in zip(weights, parts)) / sum(weights)
    assert combined == pytest.approx(float(whole), rel=1e-5)
    # the weights matter: a plain mean over the non-empty micro-batches is something else
    plain = sum(p for p, w in zip(parts, weights) if w) / sum(1 for w in weights if w)
    assert plain != pytest.approx(float(whole), rel=1e-3)


def test_aggregation_carries_gradients():
    loss, mask, short_cu = small_loss()
    x = torch.where(mask, loss, torch.zeros_like(loss)).requires_grad_(True)
    aggregate_loss(x, mask, short_cu, "seq-mean-token-mean").backward()
    # seq 0's two tokens weigh 1/2 * 1/2, seq 1's three 1/2 * 1/3, masked entries 0
    torch.testing.assert_close(x.grad, torch.tensor([0, 1 / 4, 1 / 4, 1 / 6, 1 / 6, 1 / 6, 0, 0]))


# ----------------------------------------------------------------------------- registry


def test_policy_loss_registry():
    assert {"ppo", "vanilla", "gspo", "cispo", "geo_mean", "sapo", "gpg"} <= set(policy_loss_names())
    with pytest.raises(UnknownNameError, match="registered: .*gspo.*ppo"):
        get_policy_loss("trpo")
    with pytest.raises(ValueError, match="already registered"):
        register_policy_loss("ppo", get_policy_loss("gspo"))
    with pytest.raises(TypeError, match="callable"):
        register_policy_loss("test_not_callable_loss", None)


def test_user_registered_policy_loss():
    def reinforce(logprobs, old_logprobs, advantages, loss_mask, short_cu_seqlens, cfg):
        loss = torch.where(loss_mask, -advantages * logprobs, torch.zeros_like(logprobs))
        return loss, {"clip_frac": torch.zeros(())}

    assert register_policy_loss("test_reinforce", reinforce) is reinforce
    assert "test_reinforce" in policy_loss_names()
    short_cu, mask = packing([2], [2])
    loss, _ = get_policy_loss("test_reinforce")(
        torch.tensor([-1.0, -2.0, -3.0]), torch.zeros(3), torch.tensor([5.0, 1.0, -1.0]), mask, short_cu, None
    )
    torch.testing.assert_close(loss, torch.tensor([0.0, 2.0, -3.0]))


def test_behaviour_weights_by_hand_and_the_cap():
    """w_t = pi_prox / pi_behav on the mask, 0 off it; a token above the cap drops out."""
    from realrl.impl.model.utils.policy_losses import behaviour_weights

    prox = torch.log(torch.tensor([0.5, 0.2, 0.9, 0.3]))
    behav = torch.log(torch.tensor([0.25, 0.4, 0.3, 0.3]))
    mask = torch.tensor([1, 1, 1, 0])
    w, st = behaviour_weights(prox, behav, mask, cap=None)
    torch.testing.assert_close(w, torch.tensor([2.0, 0.5, 3.0, 0.0]))
    assert float(st["behav_imp_weight"]) == pytest.approx(5.5 / 3) and float(st["behav_capped_frac"]) == 0.0
    w, st = behaviour_weights(prox, behav, mask, cap=2.5)
    torch.testing.assert_close(w, torch.tensor([2.0, 0.5, 0.0, 0.0]))  # 3 > 2.5: out
    assert float(st["behav_imp_weight"]) == pytest.approx(1.25) and float(
        st["behav_capped_frac"]
    ) == pytest.approx(1 / 3)


def test_the_decoupled_objective_by_hand_and_equal_to_ppo_when_prox_is_behav():
    """The surrogate clipped against pi_prox, times pi_prox / pi_behav: with pi_prox = pi_behav
    the weights are 1 and the loss is PPO's, exactly."""
    from realrl.impl.model.utils.policy_losses import behaviour_weights

    cfg = PolicyLossConfig(0.2, 0.2)
    ppo = get_policy_loss("ppo")
    logp = torch.log(torch.tensor([0.6, 0.1, 0.5]))
    prox = torch.log(torch.tensor([0.5, 0.2, 0.5]))
    behav = torch.log(torch.tensor([0.25, 0.2, 0.5]))
    adv = torch.tensor([1.0, -1.0, 2.0])
    mask = torch.tensor([1, 1, 1])
    short_cu = torch.tensor([0, 3])
    per_token, _ = ppo(logp, prox, adv, mask, short_cu, cfg)
    w, _ = behaviour_weights(prox, behav, mask, None)
    # token 0: r = 1.2 (at the clip), A = 1 -> -1.2, weight 2 -> -2.4; token 1: r = 0.5, A = -1 ->
    # max(0.5, 0.8) = 0.8, weight 1; token 2: r = 1, A = 2 -> -2, weight 1
    torch.testing.assert_close(per_token * w, torch.tensor([-2.4, 0.8, -2.0]))
    same, _ = ppo(logp, behav, adv, mask, short_cu, cfg)
    ones, _ = behaviour_weights(behav, behav, mask, None)
    assert torch.equal(ones, torch.ones(3)) and torch.equal(same * ones, same)
