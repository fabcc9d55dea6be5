"""verl's further estimators (advantages_verl) and its spellings: verl's padded [B, L] formulas
written out, compared on packed batches of K answers per prompt with unequal lengths."""

from __future__ import annotations

import math

import pytest
import torch
from test_advantages import from_padded, inputs, on_responses, packing, to_padded, token_rewards_of

from realrl.impl.model.utils import ppo_functional as F
from realrl.impl.model.utils.advantages import adv_estimator_names, get_adv_estimator

VERL_NEW = ("gdpo", "grpo_passk", "opo", "gpg", "optimal_token_baseline", "tir_optimal_token_baseline")
VERL_SPELLINGS = {
    "reinforce_plus_plus": "reinforce_pp",
    "reinforce_plus_plus_baseline": "reinforce_pp_baseline",
    "grpo_vectorized": "grpo",
    "rloo_vectorized": "rloo",
}


# ----------------------------------------------------------------------------- verl, written out


def group_lists(index: list[int], values: torch.Tensor) -> dict[int, list[int]]:
    rows: dict[int, list[int]] = {}
    for i in range(values.shape[0]):
        rows.setdefault(index[i], []).append(i)
    return rows


def verl_masked_whiten(x, mask):
    """verl_F.masked_whiten: mean and unbiased variance over the mask."""
    mean = (x * mask).sum() / mask.sum()
    var = (((x - mean) ** 2) * mask).sum() / mask.sum() * mask.sum() / (mask.sum() - 1)
    return (x - mean) * torch.rsqrt(var + 1e-8)


def verl_grpo_scalars(scores, index, norm_by_std, eps=1e-6):
    out = scores.clone()
    for rows in group_lists(index, scores).values():
        g = scores[rows]
        mean, std = (g.mean(), g.std()) if len(rows) > 1 else (torch.tensor(0.0), torch.tensor(1.0))
        out[rows] = (g - mean) / (std + eps) if norm_by_std else g - mean
    return out


def verl_gdpo(components, response_mask, index, weights, norm_by_std):
    """compute_gdpo_outcome_advantage: each component's GRPO advantage, weighted, then whitened."""
    total = sum(
        w * verl_grpo_scalars(c, index, norm_by_std).unsqueeze(-1) * response_mask
        for w, c in zip(weights, components)
    )
    return verl_masked_whiten(total, response_mask) * response_mask


def verl_passk(token_level_rewards, response_mask, index, norm_by_std, eps=1e-6):
    scores = token_level_rewards.sum(-1)
    adv = torch.zeros_like(scores)
    for rows in group_lists(index, scores).values():
        g = scores[rows]
        top, where = torch.topk(g, 2)
        a = top[0] - top[1]
        if norm_by_std:
            a = a / (g.std() + eps)
        adv[rows[int(where[0])]] = a
    return adv.unsqueeze(-1) * response_mask


def verl_opo(token_level_rewards, response_mask, index):
    scores, lengths = token_level_rewards.sum(-1), response_mask.sum(-1)
    out = scores.clone()
    for rows in group_lists(index, scores).values():
        out[rows] = scores[rows] - (lengths[rows] * scores[rows]).sum() / lengths[rows].sum()
    return out.unsqueeze(-1) * response_mask


def verl_gpg(token_level_rewards, response_mask, index):
    scores = token_level_rewards.sum(-1)
    alpha = scores.shape[0] / max(int(torch.count_nonzero(scores)), 1)
    out = scores.clone()
    for rows in group_lists(index, scores).values():
        out[rows] = alpha * (scores[rows] - scores[rows].mean())
    return out.unsqueeze(-1) * response_mask


def _zero_tail(baselines, rows, lengths):
    sorted_lengths, _ = torch.sort(lengths[rows])
    top, second = int(sorted_lengths[-1]), int(sorted_lengths[-2])
    longest = [r for r in rows if int(lengths[r]) == top]
    if len(longest) == 1 and top > second:
        baselines[longest[0], second:] = 0.0


def verl_otb(token_level_rewards, response_mask, index, old_log_probs, sum_pi_squared, eps=1e-8):
    """compute_optimal_token_baseline_advantage, handle_zero_tail=True: a step is a position."""
    returns = (token_level_rewards * response_mask).flip(-1).cumsum(-1).flip(-1)
    w = ((1 - 2 * old_log_probs.exp() + sum_pi_squared) * response_mask).cumsum(-1)
    lengths = response_mask.sum(-1)
    baselines = torch.zeros_like(returns)
    for rows in group_lists(index, returns).values():
        num = (returns[rows] * w[rows] * response_mask[rows]).sum(0)
        den = (w[rows] * response_mask[rows]).sum(0) + eps
        baselines[rows] = (num / den).expand(len(rows), -1)
        _zero_tail(baselines, rows, lengths)
    return (returns - baselines) * response_mask, returns


def verl_tir_otb(token_level_rewards, response_mask, index, old_log_probs, sum_pi_squared, eps=1e-8):
    """compute_multi_turn_optimal_token_baseline_advantage: a step counts the model's tokens."""
    returns = (token_level_rewards * response_mask).flip(-1).cumsum(-1).flip(-1)
    w = ((1 - 2 * old_log_probs.exp() + sum_pi_squared) * response_mask).cumsum(-1)
    lengths = response_mask.sum(-1).long()
    width = int(lengths.max())
    all_w, all_g = torch.zeros(len(lengths), width), torch.zeros(len(lengths), width)
    for i in range(len(lengths)):
        on = response_mask[i].bool()
        all_w[i, : lengths[i]], all_g[i, : lengths[i]] = w[i, on], returns[i, on]
    baselines = torch.zeros_like(all_g)
    for rows in group_lists(index, returns).values():
        baselines[rows] = ((all_g[rows] * all_w[rows]).sum(0) / (all_w[rows].sum(0) + eps)).expand(
            len(rows), -1
        )
        _zero_tail(baselines, rows, lengths)
    adv = torch.zeros_like(returns)
    for i in range(len(lengths)):
        adv[i, response_mask[i].bool()] = (all_g - baselines)[i, : lengths[i]]
    return adv * response_mask, returns


# ----------------------------------------------------------------------------- packed batches

GROUPS = [2, 3, 4]


def index_of(group_sizes):
    return [g for g, k in enumerate(group_sizes) for _ in range(k)]


def bessel(mask):
    n = float(mask.sum())
    return math.sqrt(n / (n - 1))


@pytest.fixture
def batch():
    """Nine answers to three prompts (K = 2, 3, 4), prompts of 1-3 and answers of 1-6 tokens."""
    g = torch.Generator().manual_seed(11)
    n = sum(GROUPS)
    cu, mask = packing(
        torch.randint(1, 4, (n,), generator=g).tolist(), torch.randint(1, 7, (n,), generator=g).tolist()
    )
    scores = torch.randint(0, 3, (n,), generator=g).float()  # ties and zeros, as rule rewards have
    kl = -0.05 * torch.rand(mask.shape[0], generator=g) * mask
    logp = -3 * torch.rand(mask.shape[0], generator=g)
    sum_sq = logp.exp() ** 2 + 0.5 * torch.rand(mask.shape[0], generator=g) * (1 - logp.exp()) ** 2
    return dict(
        cu=cu, mask=mask, scores=scores, rewards=token_rewards_of(kl, scores, cu), logp=logp, sum_sq=sum_sq
    )


def run(name, b, **kw):
    return get_adv_estimator(name)(inputs(b["cu"], b["mask"], b["rewards"], b["scores"], GROUPS, **kw))


def padded(b, x):
    return to_padded(x, b["mask"], b["cu"])


def unpad(b, grid):
    return from_padded(grid, b["mask"], b["cu"])


# ----------------------------------------------------------------------------- outcome estimators


@pytest.mark.parametrize("scale_by_std", [True, False])
def test_gdpo_matches_verl_with_two_weighted_components(batch, scale_by_std):
    b = batch
    n = b["scores"].shape[0]
    comps = torch.stack([b["scores"], torch.arange(n).float() % 2])  # e.g. accuracy and format
    adv, ret = run("gdpo", b, reward_components=comps, reward_weights=[0.7, 0.3], scale_by_std=scale_by_std)
    _, rmask = padded(b, b["rewards"])
    ref = verl_gdpo(list(comps), rmask, index_of(GROUPS), [0.7, 0.3], scale_by_std)
    torch.testing.assert_close(adv, unpad(b, ref) * bessel(b["mask"]), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ret, adv)


def test_gdpo_without_components_whitens_grpo(batch):
    adv, _ = run("gdpo", batch)
    grpo, _ = run("grpo", batch)
    torch.testing.assert_close(adv, F.whiten(grpo, shift_mean=True, mask=batch["mask"]))
    with pytest.raises(ValueError, match="reward_components"):
        run("gdpo", batch, reward_components=torch.zeros(2, 9), reward_weights=[1.0])


def test_gdpo_keeps_what_grpo_collapses():
    # two binary rewards: (1, 0) and (0, 1) sum to the same total; GRPO sees no difference
    cu, mask = packing([1, 1, 1, 1], [2, 3, 1, 2])
    comps = torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0]])
    total = comps.sum(0)
    inp = inputs(cu, mask, token_rewards_of(torch.zeros(mask.shape[0]), total, cu), total, [2, 2])
    grpo, _ = get_adv_estimator("grpo")(inp)
    assert (grpo[:5] == 0).all()  # group 1: totals (1, 1)
    inp.reward_components = comps
    adv, _ = get_adv_estimator("gdpo")(inp)
    # GDPO too here: group 1's components normalise to (+a, -a) and (-a, +a), which cancel, and
    # group 2's are constant: every advantage is 0
    torch.testing.assert_close(adv, torch.zeros_like(adv))
    comps2 = torch.tensor([[1.0, 0.0, 1.0, 0.0], [0.0, 1.0, 0.0, 0.0]])
    inp.reward_components = comps2
    adv, _ = get_adv_estimator("gdpo")(inp)
    a = 1 / (math.sqrt(0.5) + 1e-6)  # one component's +-0.5 over its group std
    raw = on_responses([[0.0] * 2, [0.0] * 3, [0.5 * a], [-0.5 * a] * 2], mask)
    torch.testing.assert_close(adv, F.whiten(raw, shift_mean=True, mask=mask))


@pytest.mark.parametrize("scale_by_std", [True, False])
def test_grpo_passk_matches_verl(batch, scale_by_std):
    adv, ret = run("grpo_passk", batch, scale_by_std=scale_by_std)
    rewards, rmask = padded(batch, batch["rewards"])
    torch.testing.assert_close(adv, unpad(batch, verl_passk(rewards, rmask, index_of(GROUPS), scale_by_std)))
    torch.testing.assert_close(ret, adv)
    rows, _ = padded(batch, adv)
    assert int((rows != 0).any(-1).sum()) <= len(GROUPS)  # one answer per group learns at most


def test_grpo_passk_hand_numbers_and_groups_of_one():
    cu, mask = packing([1, 2, 1, 1, 1], [2, 1, 3, 2, 1])
    scores = torch.tensor([0.0, 1.0, 3.0, 1.0, 0.0])
    inp = inputs(cu, mask, token_rewards_of(torch.zeros(mask.shape[0]), scores, cu), scores, [2, 3])
    adv, _ = get_adv_estimator("grpo_passk")(inp)
    # group 1 (0, 1): the second answer, (1 - 0) / std sqrt(0.5); group 2 (3, 1, 0): the first,
    # (3 - 1) / std(3, 1, 0) = 2 / sqrt(7/3)
    a, b = 1 / (math.sqrt(0.5) + 1e-6), 2 / (math.sqrt(7 / 3) + 1e-6)
    torch.testing.assert_close(adv, on_responses([[0.0] * 2, [a], [b] * 3, [0.0] * 2, [0.0]], mask))
    with pytest.raises(ValueError, match="2\\+ answers"):
        get_adv_estimator("grpo_passk")(inputs(cu, mask, inp.token_rewards, scores, [1, 4]))


def test_opo_matches_verl_and_hand_numbers(batch):
    adv, ret = run("opo", batch)
    rewards, rmask = padded(batch, batch["rewards"])
    torch.testing.assert_close(adv, unpad(batch, verl_opo(rewards, rmask, index_of(GROUPS))))
    torch.testing.assert_close(ret, adv)
    cu, mask = packing([1, 1, 1], [1, 3, 2])  # lengths 1 and 3 in one group, a singleton
    scores = torch.tensor([1.0, 0.0, 5.0])
    adv, _ = get_adv_estimator("opo")(
        inputs(cu, mask, token_rewards_of(torch.zeros(mask.shape[0]), scores, cu), scores, [2, 1])
    )
    # baseline (1 * 1 + 3 * 0) / 4 = 0.25; the singleton has none: 0
    torch.testing.assert_close(adv, on_responses([[0.75], [-0.25] * 3, [0.0] * 2], mask))


def test_gpg_matches_verl_and_hand_numbers(batch):
    adv, ret = run("gpg", batch)
    rewards, rmask = padded(batch, batch["rewards"])
    torch.testing.assert_close(adv, unpad(batch, verl_gpg(rewards, rmask, index_of(GROUPS))))
    torch.testing.assert_close(ret, adv)
    cu, mask = packing([1, 1, 1, 1], [1, 2, 1, 2])
    scores = torch.tensor([1.0, 0.0, 0.0, 0.0])  # one nonzero of four: alpha = 4
    adv, _ = get_adv_estimator("gpg")(
        inputs(cu, mask, token_rewards_of(torch.zeros(mask.shape[0]), scores, cu), scores, [2, 2])
    )
    torch.testing.assert_close(adv, on_responses([[2.0], [-2.0] * 2, [0.0], [0.0] * 2], mask))


# ----------------------------------------------------------------------------- optimal token baselines


@pytest.mark.parametrize("name", ["optimal_token_baseline", "tir_optimal_token_baseline"])
def test_token_baselines_match_verl_on_single_turn_answers(batch, name):
    b = batch
    adv, ret = run(name, b, old_logprobs=b["logp"], sum_pi_squared=b["sum_sq"])
    rewards, rmask = padded(b, b["rewards"])
    logp, _ = padded(b, b["logp"])
    sum_sq, _ = padded(b, b["sum_sq"])
    verl = verl_otb if name == "optimal_token_baseline" else verl_tir_otb
    ref_adv, ref_ret = verl(rewards, rmask, index_of(GROUPS), logp, sum_sq)
    torch.testing.assert_close(adv, unpad(b, ref_adv), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ret, unpad(b, ref_ret * rmask), rtol=1e-5, atol=1e-5)


def span_packing(prompt_lens, patterns):
    """Multi-turn answers: each pattern lists its response span's entries, 1 for a model token
    and 0 for an observation token between turns. Returns (cu_seqlens, loss_mask)."""
    cu = torch.tensor([0] + [p + len(s) for p, s in zip(prompt_lens, patterns)]).cumsum(0)
    mask = torch.cat(
        [torch.tensor([0] * (p - 1) + s, dtype=torch.bool) for p, s in zip(prompt_lens, patterns)]
    )
    return cu, mask


def span_padded(x, cu, prompt_lens):
    """verl's multi-turn layout: each answer's response span (observations included) in a row."""
    short = F.short_cu_seqlens(cu)
    rows = [x[int(short[i]) + p - 1 : int(short[i + 1])] for i, p in enumerate(prompt_lens)]
    grid = torch.zeros(len(rows), max(len(r) for r in rows))
    for i, r in enumerate(rows):
        grid[i, : len(r)] = r
    return grid


def test_token_baselines_on_multi_turn_answers_step_by_position_or_by_model_token():
    prompts = [2, 1, 3, 1, 2]
    patterns = [[1, 1, 0, 0, 1, 1], [1, 0, 1, 1], [1, 1, 1], [1, 1, 1, 1, 1, 1, 1], [1, 0, 0, 0, 1]]
    cu, mask = span_packing(prompts, patterns)
    g = torch.Generator().manual_seed(3)
    scores = torch.tensor([1.0, 0.0, 2.0, 1.0, 0.5])
    rewards = token_rewards_of(-0.02 * mask.float(), scores, cu)
    logp, sum_sq = -2 * torch.rand(mask.shape[0], generator=g), 0.3 * torch.rand(mask.shape[0], generator=g)
    groups, index = [2, 3], [0, 0, 1, 1, 1]
    grids = [span_padded(x, cu, prompts) for x in (rewards, mask.float(), logp, sum_sq)]
    rmask = grids[1]
    short = F.short_cu_seqlens(cu)
    results = {}
    for name, verl in (("optimal_token_baseline", verl_otb), ("tir_optimal_token_baseline", verl_tir_otb)):
        inp = inputs(cu, mask, rewards, scores, groups, old_logprobs=logp, sum_pi_squared=sum_sq)
        adv, _ = get_adv_estimator(name)(inp)
        ref, _ = verl(grids[0], rmask, index, grids[2], grids[3])
        for i, p in enumerate(prompts):
            span = adv[int(short[i]) + p - 1 : int(short[i + 1])]
            torch.testing.assert_close(span, ref[i, : span.shape[0]], rtol=1e-5, atol=1e-5)
        results[name] = adv
    assert not torch.allclose(results["optimal_token_baseline"], results["tir_optimal_token_baseline"])
    # the unique longest answer of group 2 (7 model tokens, runner-up 3): from step 3 on, A = G
    _, ret = get_adv_estimator("tir_optimal_token_baseline")(
        inputs(cu, mask, rewards, scores, groups, old_logprobs=logp)
    )
    tail = slice(int(short[3]) + 3, int(short[4]))
    torch.testing.assert_close(results["tir_optimal_token_baseline"][tail], ret[tail])


def test_token_baseline_without_sum_pi_squared_uses_the_sampled_token(batch):
    b = batch
    estimated, _ = run("optimal_token_baseline", b, old_logprobs=b["logp"])
    exact, _ = run("optimal_token_baseline", b, old_logprobs=b["logp"], sum_pi_squared=b["logp"].exp())
    torch.testing.assert_close(estimated, exact)
    with pytest.raises(ValueError, match="old_logprobs"):
        run("optimal_token_baseline", b)


def test_groups_of_one_get_zero_advantage():
    cu, mask = packing([1, 1, 1], [2, 3, 2])
    scores = torch.tensor([3.0, 1.0, 2.0])
    inp = inputs(
        cu,
        mask,
        token_rewards_of(torch.zeros(mask.shape[0]), scores, cu),
        scores,
        [1, 2],
        old_logprobs=-torch.ones(mask.shape[0]),
    )
    for name in ("opo", "gpg", "gdpo", "optimal_token_baseline", "tir_optimal_token_baseline"):
        adv, _ = get_adv_estimator(name)(inp)
        if name != "gdpo":  # gdpo's batch whitening moves the singleton's 0 too
            assert (adv[:2] == 0).all(), name
        assert (adv[2:] != 0).all(), name


# ----------------------------------------------------------------------------- names


def test_verl_spellings_run_the_same_math(batch):
    for verl_name, ours in VERL_SPELLINGS.items():
        for a, b in zip(run(verl_name, batch, discount=0.9), run(ours, batch, discount=0.9)):
            torch.testing.assert_close(a, b)
        assert get_adv_estimator(verl_name).kl_in_reward == get_adv_estimator(ours).kl_in_reward


def test_registered_with_their_needs():
    assert set(VERL_NEW) | set(VERL_SPELLINGS) <= set(adv_estimator_names())
    est = {n: get_adv_estimator(n) for n in adv_estimator_names()}
    assert {n for n, e in est.items() if e.needs_logprobs} >= {
        "optimal_token_baseline",
        "tir_optimal_token_baseline",
    }
    assert {n for n, e in est.items() if e.needs_reward_components} >= {"gdpo"}
    assert not any(est[n].needs_critic or est[n].needs_baseline for n in VERL_NEW)
    builtin = {n for n, e in est.items() if isinstance(e.fn, str)}  # not a test's own plugin estimator
    assert not any(est[n].needs_logprobs or est[n].needs_reward_components for n in builtin - set(VERL_NEW))
    assert {n for n in VERL_NEW if not est[n].kl_in_reward} == {"gdpo", "grpo_passk"}
