"""PPO / GRPO math against hand-computed numbers and a padded reference
("The N Implementation Details of RLHF with PPO")."""

import math

import pytest
import torch

from realrl.impl.model.utils import ppo_functional as F
from realrl.impl.model.utils.policy_losses import PolicyLossConfig, aggregate_loss, get_policy_loss


def test_whiten_reproduces_the_posts_printed_tensor():
    rewards = torch.tensor([[1.2, 1.3, 1.4], [1.5, 1.6, 1.7], [1.8, 1.9, 2.0]], dtype=torch.float64)
    expected = torch.tensor(
        [[0.0508, 0.4381, 0.8254], [1.2127, 1.6000, 1.9873], [2.3746, 2.7619, 3.1492]], dtype=torch.float64
    )
    torch.testing.assert_close(F.whiten(rewards, shift_mean=False), expected, atol=1e-4, rtol=0)
    # the unbiased (torch default) variance would give the post's *other* tensor: 0.1394 first
    assert abs(float(F.whiten(rewards, shift_mean=False)[0, 0]) - 0.1394) > 0.05


def test_whiten_shift_mean_and_mask():
    x = torch.tensor([1.0, 2.0, 3.0, 100.0])
    mask = torch.tensor([True, True, True, False])
    w = F.whiten(x, shift_mean=True, mask=mask)
    # moments over the first three only: mean 2, biased var 2/3
    expected = (torch.tensor([1.0, 2.0, 3.0]) - 2) / math.sqrt(2 / 3 + 1e-8)
    torch.testing.assert_close(w[:3], expected)
    assert w[3] == 0


def test_adaptive_kl_controller_numbers():
    ctl = F.AdaptiveKLController(0.15, target=6.0, horizon=10000)
    ctl.update(current=7.2, n_steps=64)  # error 0.2 -> mult 1 + 0.2 * 64 / 1e4
    assert ctl.value == pytest.approx(0.15 * 1.00128)
    ctl.update(current=3.0, n_steps=512)  # error -0.5 clipped to -0.2
    assert ctl.value == pytest.approx(0.15 * 1.00128 * (1 - 0.2 * 512 / 1e4))
    ctl.update(current=6.6, n_steps=100)  # error 0.1, not clipped
    assert ctl.value == pytest.approx(0.15 * 1.00128 * 0.98976 * 1.001)
    fixed = F.FixedKLController(0.1)
    fixed.update(100.0, 1000)
    assert fixed.value == 0.1


def test_kl_estimators_by_hand():
    logp, ref = torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -1.0])
    log_r = torch.tensor([0.5, -1.0])
    torch.testing.assert_close(F.kl_divergence(logp, ref, "k1"), log_r)
    torch.testing.assert_close(F.kl_divergence(logp, ref, "k2"), 0.5 * log_r**2)
    torch.testing.assert_close(F.kl_divergence(logp, ref, "k3"), torch.exp(-log_r) - 1 + log_r)
    assert (F.kl_divergence(logp, ref, "k3") >= 0).all()
    with pytest.raises(ValueError, match="k4"):
        F.kl_divergence(logp, ref, "k4")


def test_kl_rewards_add_the_score_at_the_last_token():
    # PPO detail "per-token KL penalty": log pi - log pi_ref = [-0.3315, -0.0426, 0.6351]
    # on the response, score 0.4 at the last token; non_score_reward = -beta * kl (train_policy.py)
    beta = 0.15
    cu = torch.tensor([0, 4, 6], dtype=torch.int32)  # seq 0: 1 prompt + 3 response; seq 1: 2 tokens
    logp = torch.tensor([-3.6528, -5.0406, -3.2339, -1.0])
    ref = torch.tensor([-3.3213, -4.9980, -3.8690, -1.5])
    mask = torch.tensor([True, True, True, True])
    kl_r, rewards = F.packed_kl_rewards(beta, logp, ref, torch.tensor([0.4, -1.0]), cu, mask)
    kl = torch.tensor([-0.3315, -0.0426, 0.6351, 0.5])
    torch.testing.assert_close(kl_r, -beta * kl, atol=1e-4, rtol=0)
    torch.testing.assert_close(rewards, -beta * kl + torch.tensor([0, 0, 0.4, -1.0]), atol=1e-4, rtol=0)


def test_response_loss_mask_aligns_with_token_plus_one():
    prompt_mask = torch.tensor([1, 1, 0, 0, 1, 0], dtype=torch.bool)
    cu = torch.tensor([0, 4, 6], dtype=torch.int32)
    # seq 0 targets tokens 1..3 -> [prompt, resp, resp]; seq 1 targets token 5 -> [resp]
    assert F.response_loss_mask(prompt_mask, cu).tolist() == [False, True, True, True]


def padded_gae_reference(rewards, values, bootstrap, gamma, lam):
    """Textbook GAE on one sequence at a time, written independently of the packed version."""
    advs, rets = [], []
    for r, v, b in zip(rewards, values, bootstrap):
        n = len(r)
        a = [0.0] * n
        last = 0.0
        for t in reversed(range(n)):
            next_v = v[t + 1] if t + 1 < n else v[n] * b
            delta = r[t] + gamma * next_v - v[t]
            last = delta + gamma * lam * last
            a[t] = last
        advs.extend(a)
        rets.extend([a[t] + v[t] for t in range(n)])
    return torch.tensor(advs, dtype=torch.float64), torch.tensor(rets, dtype=torch.float64)


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (1.0, 0.95), (0.9, 0.8)])
def test_packed_gae_equals_padded_reference(gamma, lam):
    g = torch.Generator().manual_seed(0)
    lens = [5, 2, 9, 1, 4]
    values = [torch.randn(L, generator=g, dtype=torch.float64).tolist() for L in lens]
    rewards = [torch.randn(L - 1, generator=g, dtype=torch.float64).tolist() for L in lens]
    bootstrap = [1.0, 0.0, 1.0, 0.0, 0.0]
    cu = torch.tensor([0] + lens).cumsum(0).to(torch.int32)
    adv, ret = F.packed_gae(
        torch.tensor(sum(rewards, []), dtype=torch.float64),
        torch.tensor(sum(values, []), dtype=torch.float64),
        cu,
        torch.tensor(bootstrap, dtype=torch.float64),
        gamma,
        lam,
    )
    ref_adv, ref_ret = padded_gae_reference(rewards, values, bootstrap, gamma, lam)
    torch.testing.assert_close(adv, ref_adv)
    torch.testing.assert_close(ret, ref_ret)


def test_gae_with_gamma_lambda_one_is_reward_to_go_minus_value():
    values = torch.tensor([0.5, 0.2, 0.1, 7.0], dtype=torch.float64)  # last value unused (ended)
    rewards = torch.tensor([0.0, 1.0, 2.0], dtype=torch.float64)
    adv, ret = F.packed_gae(rewards, values, torch.tensor([0, 4]), torch.tensor([0.0]), 1.0, 1.0)
    torch.testing.assert_close(ret, torch.tensor([3.0, 3.0, 2.0], dtype=torch.float64))
    torch.testing.assert_close(adv, torch.tensor([2.5, 2.8, 1.9], dtype=torch.float64))
    _, ret_boot = F.packed_gae(rewards, values, torch.tensor([0, 4]), torch.tensor([1.0]), 1.0, 1.0)
    torch.testing.assert_close(ret_boot, torch.tensor([10.0, 10.0, 9.0], dtype=torch.float64))


def test_group_normalized_advantages():
    scores = torch.tensor([1.0, 2.0, 3.0, 5.0, 5.0, 4.0])
    adv = F.group_normalized_advantages(scores, [3, 1, 2])
    torch.testing.assert_close(adv[:3], torch.tensor([-1.0, 0.0, 1.0]), atol=1e-5, rtol=0)
    assert adv[3] == 0  # a group of one carries no signal
    std = torch.tensor([5.0, 4.0]).std()
    torch.testing.assert_close(adv[4:], torch.tensor([0.5, -0.5]) / (std + 1e-6))
    no_std = F.group_normalized_advantages(scores, [3, 1, 2], scale_by_std=False)
    torch.testing.assert_close(no_std[:3], torch.tensor([-1.0, 0.0, 1.0]))


def test_actor_loss_by_hand():
    logp = torch.tensor([0.0, math.log(1.5), math.log(0.5), 3.0])
    old = torch.zeros(4)
    adv = torch.tensor([1.0, 1.0, -2.0, 100.0])
    mask = torch.tensor([True, True, True, False])
    short_cu = torch.tensor([0, 4])  # one answer of 4 token-minus-one entries
    per_token, stats = get_policy_loss("ppo")(logp, old, adv, mask, short_cu, PolicyLossConfig(0.2, 0.2))
    loss = aggregate_loss(per_token, mask, short_cu, "token-mean")
    # token 0: ratio 1 -> -1; token 1: ratio 1.5 clipped to 1.2 -> max(-1.5, -1.2) = -1.2
    # token 2: ratio 0.5, A = -2 -> max(1.0, 1.6) = 1.6; token 3 masked
    assert float(loss) == pytest.approx((-1.0 - 1.2 + 1.6) / 3)
    assert float(stats["clip_frac"]) == pytest.approx(2 / 3)
    assert float(stats["importance_ratio"]) == pytest.approx(1.0)
    assert float(stats["approx_kl"]) == pytest.approx(-(math.log(1.5) + math.log(0.5)) / 3)


def test_critic_loss_by_hand():
    v = torch.tensor([1.0, 0.0, 5.0])
    old = torch.tensor([0.5, 0.5, 0.0])
    ret = torch.tensor([2.0, 0.0, 1.0])
    mask = torch.tensor([True, True, False])
    loss, _ = F.critic_loss(v, old, ret, 0.2, mask)
    # tok 0: unclipped (1-2)^2 = 1, clipped 0.7 -> (0.7-2)^2 = 1.69 -> 1.69
    # tok 1: unclipped 0, clipped 0.3 -> 0.09 -> 0.09
    assert float(loss) == pytest.approx(0.5 * (1.69 + 0.09) / 2)
    plain, _ = F.critic_loss(v, old, ret, None, mask)
    assert float(plain) == pytest.approx(0.5 * (1.0 + 0.0) / 2)


def test_reward_clipping():
    torch.testing.assert_close(
        F.clip_rewards(torch.tensor([-30.0, 3.0, 25.0]), 20.0), torch.tensor([-20.0, 3.0, 20.0])
    )
    torch.testing.assert_close(F.clip_rewards(torch.tensor([-30.0]), None), torch.tensor([-30.0]))


@pytest.mark.parametrize("beta", [1.0, 0.9])
def test_running_mean_std_round_trip(beta):
    rms = F.RunningMeanStd(beta=beta)
    x = torch.tensor([1.0, 3.0, 5.0, 7.0])
    rms.update(x)
    mean, std = rms.mean_std()
    assert mean == pytest.approx(4.0)
    assert std == pytest.approx(math.sqrt(5.0))
    torch.testing.assert_close(rms.denormalize(rms.normalize(x)), x)
