"""Advantage estimators: hand-computed numbers, and verl's padded [B, L] formulas written out."""

from __future__ import annotations

import math

import pytest
import torch

from realrl.base.registry import UnknownNameError
from realrl.impl.model.utils import ppo_functional as F
from realrl.impl.model.utils.advantages import (
    AdvantageInputs,
    adv_estimator_names,
    get_adv_estimator,
    packed_discounted_returns,
    register_adv_estimator,
)

BUILTINS = {"gae", "grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "remax"}


# ----------------------------------------------------------------------------- packing helpers


def packing(prompt_lens: list[int], resp_lens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(cu_seqlens [N + 1], loss_mask [T - N]) of sequences of prompt + response tokens."""
    lens = [p + r for p, r in zip(prompt_lens, resp_lens)]
    cu = torch.tensor([0] + lens).cumsum(0)
    mask = torch.cat([torch.tensor([False] * (p - 1) + [True] * r) for p, r in zip(prompt_lens, resp_lens)])
    return cu, mask


def on_responses(per_seq: list[list[float]], mask: torch.Tensor) -> torch.Tensor:
    """A [T - N] tensor holding each sequence's listed values on its response entries, 0 elsewhere."""
    out = torch.zeros(mask.shape[0])
    out[mask] = torch.tensor([x for row in per_seq for x in row], dtype=torch.float32)
    return out


def to_padded(x: torch.Tensor, mask: torch.Tensor, cu: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's layout: each sequence's response entries left-aligned in a row, right-padded with 0;
    returns (grid [B, L], response_mask [B, L])."""
    short = F.short_cu_seqlens(cu)
    rows = [x[short[i] : short[i + 1]][mask[short[i] : short[i + 1]]] for i in range(len(cu) - 1)]
    width = max(len(r) for r in rows)
    grid = torch.zeros(len(rows), width, dtype=x.dtype)
    rmask = torch.zeros(len(rows), width)
    for i, r in enumerate(rows):
        grid[i, : len(r)] = r
        rmask[i, : len(r)] = 1.0
    return grid, rmask


def from_padded(grid: torch.Tensor, mask: torch.Tensor, cu: torch.Tensor) -> torch.Tensor:
    """The inverse of ``to_padded``: response entries back in the packed layout, 0 elsewhere."""
    short = F.short_cu_seqlens(cu)
    out = torch.zeros(mask.shape[0], dtype=grid.dtype)
    for i in range(len(cu) - 1):
        idx = torch.arange(int(short[i]), int(short[i + 1]))[mask[short[i] : short[i + 1]]]
        out[idx] = grid[i, : len(idx)]
    return out


def token_rewards_of(kl: torch.Tensor, scores: torch.Tensor, cu: torch.Tensor) -> torch.Tensor:
    """What ``packed_kl_rewards`` returns as ``rewards``: the KL reward plus the score at the end."""
    rewards = kl.clone()
    rewards[F.last_indices(F.short_cu_seqlens(cu))] += scores
    return rewards


def inputs(cu, mask, token_rewards, scores, group_sizes, **kw) -> AdvantageInputs:
    return AdvantageInputs(
        token_rewards=token_rewards,
        scores=scores,
        loss_mask=mask,
        cu_seqlens=cu,
        group_sizes=group_sizes,
        **kw,
    )


# Two groups (2 and 3 answers), 2-4 response tokens each, 1 or 2 prompt tokens.
PROMPTS = [1, 2, 1, 1, 2]
RESPONSES = [2, 3, 4, 2, 3]
GROUPS = [2, 3]
SCORES = torch.tensor([1.0, 0.0, 2.0, 0.0, 1.0])


@pytest.fixture
def batch():
    cu, mask = packing(PROMPTS, RESPONSES)
    return cu, mask


def kl_batch(cu, mask, kl_per_token: float = -0.1) -> torch.Tensor:
    return token_rewards_of(kl_per_token * mask.float(), SCORES, cu)


# ----------------------------------------------------------------------------- hand-computed numbers


def test_grpo_hand_numbers_no_kl(batch):
    cu, mask = batch
    inp = inputs(cu, mask, token_rewards_of(torch.zeros(mask.shape[0]), SCORES, cu), SCORES, GROUPS)
    adv, ret = get_adv_estimator("grpo")(inp)
    # group 1: scores (1, 0): mean 0.5, unbiased std sqrt(0.5); group 2: (2, 0, 1): mean 1, std 1
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    b = 1.0 / (1.0 + 1e-6)
    expected = on_responses([[a] * 2, [-a] * 3, [b] * 4, [-b] * 2, [0.0] * 3], mask)
    torch.testing.assert_close(adv, expected)
    torch.testing.assert_close(ret, expected)
    assert (adv[~mask] == 0).all()


def test_grpo_and_dr_grpo_outcome_includes_summed_kl_reward(batch):
    cu, mask = batch
    inp = inputs(cu, mask, kl_batch(cu, mask), SCORES, GROUPS)
    # outcomes = score - 0.1 * response length = (0.8, -0.3 | 1.6, -0.2, 0.7)
    adv, _ = get_adv_estimator("grpo")(inp)
    a, b = 0.55 / (math.sqrt(2 * 0.55**2) + 1e-6), 0.9 / (0.9 + 1e-6)
    torch.testing.assert_close(adv, on_responses([[a] * 2, [-a] * 3, [b] * 4, [-b] * 2, [0.0] * 3], mask))
    inp.scale_by_std = False  # Dr. GRPO: the mean shift only
    adv, _ = get_adv_estimator("grpo")(inp)
    torch.testing.assert_close(
        adv, on_responses([[0.55] * 2, [-0.55] * 3, [0.9] * 4, [-0.9] * 2, [0.0] * 3], mask)
    )


def test_rloo_hand_numbers(batch):
    cu, mask = batch
    adv, ret = get_adv_estimator("rloo")(inputs(cu, mask, kl_batch(cu, mask), SCORES, GROUPS))
    # outcomes (0.8, -0.3 | 1.6, -0.2, 0.7): 0.8 - (-0.3) = 1.1; 1.6 - (-0.2 + 0.7) / 2 = 1.35;
    # -0.2 - (1.6 + 0.7) / 2 = -1.35; 0.7 - (1.6 - 0.2) / 2 = 0
    expected = on_responses([[1.1] * 2, [-1.1] * 3, [1.35] * 4, [-1.35] * 2, [0.0] * 3], mask)
    torch.testing.assert_close(adv, expected)
    torch.testing.assert_close(ret, expected)


def test_groups_of_one_get_zero_advantage():
    cu, mask = packing([1, 1, 1], [2, 3, 2])
    scores = torch.tensor([3.0, 1.0, 2.0])
    inp = inputs(cu, mask, token_rewards_of(torch.zeros(mask.shape[0]), scores, cu), scores, [1, 2])
    for name in ("grpo", "rloo"):
        adv, _ = get_adv_estimator(name)(inp)
        assert (adv[:2] == 0).all(), name  # the singleton's two entries
        assert (adv[2:] != 0).all(), name
    # reinforce_pp_baseline: the singleton's centred outcome is 0 before the batch whitening
    adv, _ = get_adv_estimator("reinforce_pp_baseline")(inp)
    centred = torch.tensor([0.0] * 2 + [-0.5] * 3 + [0.5] * 2)  # group (1, 2): mean 1.5
    torch.testing.assert_close(adv, F.whiten(centred, shift_mean=True, mask=mask))


def test_reinforce_pp_hand_returns(batch):
    cu, mask = batch
    inp = inputs(cu, mask, kl_batch(cu, mask), SCORES, GROUPS, discount=0.5)
    adv, ret = get_adv_estimator("reinforce_pp")(inp)
    # seq 0 rewards (-0.1, 0.9): G = (-0.1 + 0.5 * 0.9, 0.9); seq 1 (-0.1, -0.1, -0.1):
    # G = (-0.175, -0.15, -0.1); seq 3 (-0.1, -0.1): (-0.15, -0.1)
    torch.testing.assert_close(ret[0:2], torch.tensor([0.35, 0.9]))
    torch.testing.assert_close(ret[2:6], torch.tensor([0.0, -0.175, -0.15, -0.1]))
    torch.testing.assert_close(ret[10:12], torch.tensor([-0.15, -0.1]))
    # the advantages are the returns whitened over every response token of the batch
    g = ret[mask].double()
    expected = (g - g.mean()) / torch.sqrt(g.var(unbiased=False) + 1e-8)
    torch.testing.assert_close(adv[mask].double(), expected, rtol=1e-5, atol=1e-6)
    assert (adv[~mask] == 0).all() and (ret[~mask] == 0).all()


def test_reinforce_pp_baseline_hand_numbers(batch):
    cu, mask = batch
    adv, ret = get_adv_estimator("reinforce_pp_baseline")(
        inputs(cu, mask, kl_batch(cu, mask), SCORES, GROUPS)
    )
    # outcome minus group mean: (0.55, -0.55 | 0.9, -0.9, 0), then whitened over the 14 tokens
    centred = torch.tensor([0.55] * 2 + [-0.55] * 3 + [0.9] * 4 + [-0.9] * 2 + [0.0] * 3, dtype=torch.float64)
    expected = (centred - centred.mean()) / torch.sqrt(centred.var(unbiased=False) + 1e-8)
    torch.testing.assert_close(adv[mask].double(), expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ret, adv)


def test_remax_hand_numbers(batch):
    cu, mask = batch
    baseline = torch.tensor([0.5, 0.5, 1.0, 1.0, 1.0])
    inp = inputs(cu, mask, kl_batch(cu, mask), SCORES, GROUPS, baseline_scores=baseline, discount=0.5)
    adv, ret = get_adv_estimator("remax")(inp)
    # gamma is 1 whatever ``discount`` says: seq 0 returns (0.8, 0.9), seq 1 (-0.3, -0.2, -0.1)
    torch.testing.assert_close(ret[0:6], torch.tensor([0.8, 0.9, 0.0, -0.3, -0.2, -0.1]))
    torch.testing.assert_close(adv[0:6], torch.tensor([0.3, 0.4, 0.0, -0.8, -0.7, -0.6]))
    # seq 2: rewards (-0.1, -0.1, -0.1, 1.9), baseline 1
    torch.testing.assert_close(adv[6:10], torch.tensor([0.6, 0.7, 0.8, 0.9]))


def test_gae_hand_numbers_with_and_without_bootstrap():
    cu, mask = packing([2], [2])  # entries: (prompt 0 -> prompt 1), then two response tokens
    values = torch.tensor([0.3, 0.5, 0.2, 0.9])  # value after each token
    rewards = torch.tensor([0.0, 0.0, 1.0])
    kw = dict(values=values, discount=0.9, gae_lambda=0.8)
    adv, ret = get_adv_estimator("gae")(
        inputs(cu, mask, rewards, torch.ones(1), [1], bootstrap=torch.zeros(1), **kw)
    )
    # delta_2 = 1 - 0.2 = 0.8; delta_1 = 0.9 * 0.2 - 0.5 = -0.32; A_1 = -0.32 + 0.72 * 0.8
    torch.testing.assert_close(adv, torch.tensor([0.0, 0.256, 0.8]))
    torch.testing.assert_close(ret, torch.tensor([0.0, 0.756, 1.0]))
    adv, ret = get_adv_estimator("gae")(
        inputs(cu, mask, rewards, torch.ones(1), [1], bootstrap=torch.ones(1), **kw)
    )
    # the future after the cut is worth V_last = 0.9: delta_2 = 1 + 0.81 - 0.2 = 1.61
    torch.testing.assert_close(adv, torch.tensor([0.0, 0.8392, 1.61]))
    torch.testing.assert_close(ret, torch.tensor([0.0, 1.3392, 1.81]))


def test_gae_reward_whitening_keeps_the_mean(batch):
    cu, mask = batch
    rewards = kl_batch(cu, mask)
    zeros_v = torch.zeros(int(cu[-1]))
    inp = inputs(cu, mask, rewards, SCORES, GROUPS, values=zeros_v, bootstrap=torch.zeros(5))
    plain, _ = get_adv_estimator("gae")(inp)
    inp.reward_whiten = True
    whitened, _ = get_adv_estimator("gae")(inp)
    r = rewards[mask].double()
    w = (r - r.mean()) / torch.sqrt(r.var(unbiased=False) + 1e-8) + r.mean()
    # gamma = lambda = 1 and V = 0: the advantage is the sum of the (whitened) rewards to come
    expected = packed_discounted_returns(on_responses([w.tolist()], mask), F.short_cu_seqlens(cu), 1.0)
    torch.testing.assert_close(whitened, expected * mask, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(whitened, plain)


def test_discounted_returns_stay_within_a_sequence():
    cu, _ = packing([1, 1], [2, 2])
    short = F.short_cu_seqlens(cu)
    r = torch.tensor([1.0, 2.0, 4.0, 8.0])
    torch.testing.assert_close(packed_discounted_returns(r, short, 1.0), torch.tensor([3.0, 2.0, 12.0, 8.0]))
    torch.testing.assert_close(packed_discounted_returns(r, short, 0.5), torch.tensor([2.0, 2.0, 8.0, 8.0]))


# ----------------------------------------------------------------------------- verl's padded formulas


def verl_masked_mean(x, mask):
    return (x * mask).sum() / mask.sum()


def verl_masked_whiten(x, mask):
    """verl_F.masked_whiten: the variance is unbiased (Bessel's correction)."""
    mean = verl_masked_mean(x, mask)
    var = verl_masked_mean((x - mean) ** 2, mask) * mask.sum() / (mask.sum() - 1)
    return (x - mean) * torch.rsqrt(var + 1e-8)


def verl_gae(token_level_rewards, values, response_mask, gamma, lam):
    """compute_gae_advantage_return, before its final advantage whitening."""
    nextvalues = torch.zeros(values.shape[0], dtype=values.dtype)
    lastgaelam = torch.zeros_like(nextvalues)
    advantages_reversed = []
    for t in reversed(range(token_level_rewards.shape[-1])):
        delta = token_level_rewards[:, t] + gamma * nextvalues - values[:, t]
        lastgaelam_ = delta + gamma * lam * lastgaelam
        nextvalues = values[:, t] * response_mask[:, t] + (1 - response_mask[:, t]) * nextvalues
        lastgaelam = lastgaelam_ * response_mask[:, t] + (1 - response_mask[:, t]) * lastgaelam
        advantages_reversed.append(lastgaelam)
    advantages = torch.stack(advantages_reversed[::-1], dim=1)
    return advantages, advantages + values


def _group_index(group_sizes):
    return [g for g, k in enumerate(group_sizes) for _ in range(k)]


def verl_grpo(token_level_rewards, response_mask, index, norm_adv_by_std_in_grpo, epsilon=1e-6):
    scores = token_level_rewards.sum(dim=-1)
    id2score: dict[int, list[torch.Tensor]] = {}
    for i in range(scores.shape[0]):
        id2score.setdefault(index[i], []).append(scores[i])
    id2mean, id2std = {}, {}
    for idx, group in id2score.items():
        if len(group) == 1:
            id2mean[idx], id2std[idx] = torch.tensor(0.0), torch.tensor(1.0)
        else:
            id2mean[idx], id2std[idx] = torch.mean(torch.stack(group)), torch.std(torch.stack(group))
    for i in range(scores.shape[0]):
        if norm_adv_by_std_in_grpo:
            scores[i] = (scores[i] - id2mean[index[i]]) / (id2std[index[i]] + epsilon)
        else:
            scores[i] = scores[i] - id2mean[index[i]]
    scores = scores.unsqueeze(-1) * response_mask
    return scores, scores


def verl_rloo(token_level_rewards, response_mask, index):
    scores = token_level_rewards.sum(dim=-1)
    id2score: dict[int, list[torch.Tensor]] = {}
    for i in range(scores.shape[0]):
        id2score.setdefault(index[i], []).append(scores[i])
    id2mean = {idx: torch.mean(torch.stack(g)) if len(g) > 1 else 0.0 for idx, g in id2score.items()}
    for i in range(scores.shape[0]):
        k = len(id2score[index[i]])
        if k > 1:
            scores[i] = scores[i] * k / (k - 1) - id2mean[index[i]] * k / (k - 1)
    scores = scores.unsqueeze(-1) * response_mask
    return scores, scores


def verl_reinforce_pp(token_level_rewards, response_mask, gamma):
    returns = torch.zeros_like(token_level_rewards)
    running_return = torch.zeros(token_level_rewards.shape[0], dtype=token_level_rewards.dtype)
    for t in reversed(range(token_level_rewards.shape[1])):
        running_return = token_level_rewards[:, t] + gamma * running_return
        returns[:, t] = running_return
        running_return = running_return * response_mask[:, t]
    advantages = verl_masked_whiten(returns, response_mask) * response_mask
    return advantages, returns


def verl_reinforce_pp_baseline(token_level_rewards, response_mask, index):
    response_length = token_level_rewards.shape[-1]
    scores = token_level_rewards.sum(dim=-1)
    id2score: dict[int, list[torch.Tensor]] = {}
    for i in range(scores.shape[0]):
        id2score.setdefault(index[i], []).append(scores[i])
    id2mean = {idx: torch.mean(torch.stack(g)) if len(g) > 1 else 0.0 for idx, g in id2score.items()}
    for i in range(scores.shape[0]):
        scores[i] = scores[i] - id2mean[index[i]]
    scores = scores.unsqueeze(-1).tile([1, response_length]) * response_mask
    scores = verl_masked_whiten(scores, response_mask) * response_mask
    return scores, scores


def verl_remax(token_level_rewards, reward_baselines, response_mask):
    returns = (token_level_rewards * response_mask).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])
    advantages = returns - reward_baselines.unsqueeze(-1) * response_mask
    return advantages, returns


@pytest.fixture
def random_batch():
    g = torch.Generator().manual_seed(7)
    group_sizes = [2, 3, 4]
    n = sum(group_sizes)
    prompts = torch.randint(1, 4, (n,), generator=g).tolist()
    responses = torch.randint(1, 7, (n,), generator=g).tolist()
    cu, mask = packing(prompts, responses)
    kl = -0.05 * torch.rand(mask.shape[0], generator=g) * mask
    scores = torch.randn(n, generator=g)
    return dict(
        cu=cu,
        mask=mask,
        scores=scores,
        token_rewards=token_rewards_of(kl, scores, cu),
        group_sizes=group_sizes,
        values=torch.randn(int(cu[-1]), generator=g),
        baseline=torch.randn(n, generator=g),
    )


def _padded(b, x):
    return to_padded(x, b["mask"], b["cu"])


def test_gae_matches_verl(random_batch):
    b = random_batch
    cu, mask = b["cu"], b["mask"]
    n = len(cu) - 1
    inp = inputs(cu, mask, b["token_rewards"], b["scores"], b["group_sizes"], values=b["values"])
    inp.bootstrap, inp.discount, inp.gae_lambda = torch.zeros(n), 0.95, 0.9
    adv, ret = get_adv_estimator("gae")(inp)
    # verl's values[:, t] is the value of the state before response token t: ours after token j
    last = F.last_indices(cu)
    keep = torch.ones(int(cu[-1]), dtype=torch.bool)
    keep[last] = False
    rewards, rmask = _padded(b, b["token_rewards"])
    values, _ = _padded(b, b["values"][keep])
    ref_adv, ref_ret = verl_gae(rewards, values * rmask, rmask, 0.95, 0.9)
    torch.testing.assert_close(adv, from_padded(ref_adv * rmask, mask, cu))
    torch.testing.assert_close(ret, from_padded(ref_ret * rmask, mask, cu))


@pytest.mark.parametrize("scale_by_std", [True, False])
def test_grpo_matches_verl(random_batch, scale_by_std):
    b = random_batch
    inp = inputs(
        b["cu"], b["mask"], b["token_rewards"], b["scores"], b["group_sizes"], scale_by_std=scale_by_std
    )
    adv, ret = get_adv_estimator("grpo")(inp)
    rewards, rmask = _padded(b, b["token_rewards"])
    ref, _ = verl_grpo(rewards, rmask, _group_index(b["group_sizes"]), scale_by_std)
    torch.testing.assert_close(adv, from_padded(ref, b["mask"], b["cu"]))
    torch.testing.assert_close(ret, adv)


def test_rloo_matches_verl(random_batch):
    b = random_batch
    adv, _ = get_adv_estimator("rloo")(
        inputs(b["cu"], b["mask"], b["token_rewards"], b["scores"], b["group_sizes"])
    )
    rewards, rmask = _padded(b, b["token_rewards"])
    ref, _ = verl_rloo(rewards, rmask, _group_index(b["group_sizes"]))
    torch.testing.assert_close(adv, from_padded(ref, b["mask"], b["cu"]))


@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_reinforce_pp_matches_verl(random_batch, gamma):
    b = random_batch
    inp = inputs(b["cu"], b["mask"], b["token_rewards"], b["scores"], b["group_sizes"], discount=gamma)
    adv, ret = get_adv_estimator("reinforce_pp")(inp)
    rewards, rmask = _padded(b, b["token_rewards"])
    ref_adv, ref_ret = verl_reinforce_pp(rewards, rmask, gamma)
    torch.testing.assert_close(ret, from_padded(ref_ret, b["mask"], b["cu"]))
    # ours whitens with the biased variance, verl with the unbiased one
    n_tok = float(b["mask"].sum())
    bessel = math.sqrt(n_tok / (n_tok - 1))
    torch.testing.assert_close(adv, from_padded(ref_adv, b["mask"], b["cu"]) * bessel, rtol=1e-5, atol=1e-6)


def test_reinforce_pp_baseline_matches_verl(random_batch):
    b = random_batch
    adv, _ = get_adv_estimator("reinforce_pp_baseline")(
        inputs(b["cu"], b["mask"], b["token_rewards"], b["scores"], b["group_sizes"])
    )
    rewards, rmask = _padded(b, b["token_rewards"])
    ref, _ = verl_reinforce_pp_baseline(rewards, rmask, _group_index(b["group_sizes"]))
    n_tok = float(b["mask"].sum())
    bessel = math.sqrt(n_tok / (n_tok - 1))
    torch.testing.assert_close(adv, from_padded(ref, b["mask"], b["cu"]) * bessel, rtol=1e-5, atol=1e-6)


def test_remax_matches_verl(random_batch):
    b = random_batch
    inp = inputs(b["cu"], b["mask"], b["token_rewards"], b["scores"], b["group_sizes"])
    inp.baseline_scores = b["baseline"]
    adv, ret = get_adv_estimator("remax")(inp)
    rewards, rmask = _padded(b, b["token_rewards"])
    ref_adv, ref_ret = verl_remax(rewards, b["baseline"], rmask)
    torch.testing.assert_close(adv, from_padded(ref_adv * rmask, b["mask"], b["cu"]))
    torch.testing.assert_close(ret, from_padded(ref_ret * rmask, b["mask"], b["cu"]))


# ----------------------------------------------------------------------------- registry


def test_builtins_and_their_requirements():
    assert BUILTINS <= set(adv_estimator_names())
    assert adv_estimator_names() == sorted(adv_estimator_names())
    flags = {n: get_adv_estimator(n) for n in BUILTINS}
    assert {n for n, e in flags.items() if e.needs_critic} == {"gae"}
    assert {n for n, e in flags.items() if e.needs_baseline} == {"remax"}
    assert {n for n, e in flags.items() if not e.kl_in_reward} == {"grpo"}
    assert all(e.name == n for n, e in flags.items())


def test_unknown_and_duplicate_names():
    with pytest.raises(UnknownNameError, match="registered: .*gae.*grpo.*rloo"):
        get_adv_estimator("ppo_magic")
    with pytest.raises(ValueError, match="already registered"):
        register_adv_estimator("grpo", lambda inp: (inp.token_rewards, inp.token_rewards))
    with pytest.raises(TypeError, match="callable"):
        register_adv_estimator("test_not_callable", 3)
    assert "test_not_callable" not in adv_estimator_names()


def test_user_registered_estimator(batch):
    cu, mask = batch

    def constant(inp: AdvantageInputs):
        m = inp.loss_mask.float()
        return 2.0 * m, 3.0 * m

    est = register_adv_estimator("test_constant", constant, needs_baseline=True, kl_in_reward=False)
    assert get_adv_estimator("test_constant") is est
    assert est.needs_baseline and not est.needs_critic and not est.kl_in_reward
    assert "test_constant" in adv_estimator_names()
    adv, ret = get_adv_estimator("test_constant")(inputs(cu, mask, kl_batch(cu, mask), SCORES, GROUPS))
    torch.testing.assert_close(adv, 2.0 * mask.float())
    torch.testing.assert_close(ret, 3.0 * mask.float())


def test_missing_inputs_and_bad_packing(batch):
    cu, mask = batch
    rewards = kl_batch(cu, mask)
    with pytest.raises(ValueError, match="values"):
        get_adv_estimator("gae")(inputs(cu, mask, rewards, SCORES, GROUPS))
    with pytest.raises(ValueError, match="baseline_scores"):
        get_adv_estimator("remax")(inputs(cu, mask, rewards, SCORES, GROUPS))
    with pytest.raises(ValueError, match="group_sizes"):
        get_adv_estimator("grpo")(inputs(cu, mask, rewards, SCORES, [2, 2]))
    with pytest.raises(ValueError, match="T - N"):
        get_adv_estimator("rloo")(inputs(cu, mask[:-1], rewards[:-1], SCORES, GROUPS))
