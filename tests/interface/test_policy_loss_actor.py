"""The actor's train step with the registered policy losses (ppo, gspo), the loss aggregation
modes and DAPO's clip-higher, on tiny ReaLModels behind the real train engine."""

from __future__ import annotations

import math

import pytest
import torch
from interface_fixtures import make_model, prompt_answer_batch, prompt_batch

from realrl.api.core.config import ModelInterfaceAbstraction, ModelName
from realrl.api.core.model_api import Model, make_interface
from realrl.impl.interface.common import per_sequence_sample, token_minus_one_sample
from realrl.impl.interface.ppo_config import make_ppo_hyperparameters
from realrl.impl.model.utils import ppo_functional as F
from realrl.impl.model.utils.policy_losses import AGGREGATIONS, PolicyLossConfig

PROMPTS = ["w1 w2", "w3"]
GEN = {"max_new_tokens": 6, "min_new_tokens": 1, "top_p": 1.0, "top_k": 0, "n": 4}
GROUP_REWARDS = [0.5, -1.0, 2.0, 0.0, 1.5, 1.0, -0.5, 3.0]  # distinct in each group of 4


def iface(name, preset="grpo", **ppo):
    ppo.setdefault("gen", GEN)
    return make_interface(ModelInterfaceAbstraction(name, {"ppo": ppo, "preset": preset}))


def rollout_with_advantages(tokenizer, actor, a, adv):
    """actor_gen -> rew (given) -> ref_inf (the actor itself) -> compute_adv, into one batch."""
    torch.manual_seed(0)
    data = a.generate(actor, prompt_batch(tokenizer, PROMPTS))
    data.update_(a.inference(actor, data))
    data.update_(per_sequence_sample(data, "rewards", torch.tensor(GROUP_REWARDS)))
    out, _ = adv.inference(Model(ModelName("adv"), None, tokenizer), data)
    data.update_(out)
    return data


def per_answer_sums(x, data):
    """[T - N] -> [N]: the sum of each answer's entries."""
    return torch.stack([p.sum() for p in x.split([n - 1 for n in data.flat_seqlens("packed_input_ids")])])


LOSS_CASES = [
    ("ppo", "token-mean"),
    ("ppo", "seq-mean-token-sum"),
    ("ppo", "seq-mean-token-mean"),
    ("ppo", "seq-mean-token-sum-norm"),
    ("gspo", "seq-mean-token-mean"),
    ("gspo", "token-mean"),
]


@pytest.mark.parametrize("policy_loss,agg", LOSS_CASES)
def test_one_step_raises_logprobs_of_positively_advantaged_answers(tokenizer, policy_loss, agg):
    actor = make_model(tokenizer, lr=3e-3)
    opts = dict(
        policy_loss=policy_loss,
        loss_agg_mode=agg,
        kl_loss_coef=0.0,
        early_stop_imp_ratio=None,
        ppo_n_minibatches=1,
    )
    if policy_loss == "gspo":
        opts.update(eps_clip=3e-4, eps_clip_high=4e-4)  # the paper's sequence-ratio range
    a, adv = iface("ppo_actor", **opts), iface("ppo_advantages", **opts)
    assert (a.hp.policy_loss, a.hp.loss_agg_mode) == (policy_loss, agg)
    data = rollout_with_advantages(tokenizer, actor, a, adv)
    mask = data.data["ppo_loss_mask"]
    adv_seq = per_answer_sums(data.data["advantages"] * mask, data)
    before = a.inference(actor, data).data["packed_ref_logprobs"]
    stats = a.train_step(actor, data)
    after = a.inference(actor, data).data["packed_ref_logprobs"]
    delta = per_answer_sums((after - before) * mask, data)  # change of each answer's log-likelihood
    pos, neg = adv_seq > 0, adv_seq < 0
    assert pos.any() and neg.any()
    assert float(delta[pos].mean()) > 0 > float(delta[neg].mean())
    assert stats["importance_ratio"] == pytest.approx(1.0, abs=1e-4)  # one update on fresh samples
    assert stats["clip_frac"] == 0.0
    assert actor.version.global_step == 1


@pytest.mark.parametrize("agg", AGGREGATIONS)
def test_loss_weight_counts_tokens_or_answers(tokenizer, agg):
    """A micro-batch's share when micro-batch losses are combined: its response tokens for
    token-mean, its answers with at least one response token for the sequence means."""
    a = iface("ppo_actor", loss_agg_mode=agg)
    # 2 + 1 + 0 + 3 response tokens in 4 answers, one of them empty
    mb = prompt_answer_batch(tokenizer, [("w1 w2", "good ."), ("w3", "bad"), ("w4", ""), ("w5", "w6 w7 w8")])
    cu = mb.cu_seqlens("packed_input_ids")
    mb.update_(token_minus_one_sample(mb, "ppo_loss_mask", F.response_loss_mask(mb.data["prompt_mask"], cu)))
    expected = 6.0 if agg == "token-mean" else 3.0
    assert a._loss_weight(mb) == expected


def test_loss_weight_on_a_generated_batch(tokenizer):
    actor = make_model(tokenizer)
    a, adv = iface("ppo_actor"), iface("ppo_advantages")
    data = rollout_with_advantages(tokenizer, actor, a, adv)
    n_tokens = float(data.data["ppo_loss_mask"].sum())
    assert a._loss_weight(data) == n_tokens  # the grpo preset aggregates token-mean
    for agg in AGGREGATIONS[1:]:
        assert iface("ppo_actor", loss_agg_mode=agg)._loss_weight(data) == 8.0  # 2 prompts x 4 answers


def test_loss_config_carries_clip_higher_and_dual_clip():
    hp = make_ppo_hyperparameters({"eps_clip": 0.2, "eps_clip_high": 0.28})
    assert hp.clip_high == 0.28
    assert hp.loss_config() == PolicyLossConfig(eps_clip_low=0.2, eps_clip_high=0.28, dual_clip=None)
    hp = make_ppo_hyperparameters({"eps_clip": 0.15})  # symmetric unless eps_clip_high is set
    assert hp.clip_high == 0.15 and hp.loss_config() == PolicyLossConfig(0.15, 0.15, None)
    assert make_ppo_hyperparameters({"dual_clip": 3.0}).loss_config().dual_clip == 3.0
    assert make_ppo_hyperparameters(preset="dapo").loss_config() == PolicyLossConfig(0.2, 0.28, None)
    assert make_ppo_hyperparameters(preset="gspo").loss_config() == PolicyLossConfig(3e-4, 4e-4, None)
    hp = make_ppo_hyperparameters(preset="dr_grpo")
    assert hp.loss_agg_mode == "seq-mean-token-sum-norm" and hp.norm_const() == hp.gen.max_new_tokens
    assert make_ppo_hyperparameters({"loss_norm_const": 100.0}, "dr_grpo").norm_const() == 100.0
    for bad in ({"eps_clip_high": -0.1}, {"dual_clip": 1.0}, {"eps_clip": 1.0}):
        with pytest.raises(ValueError):
            make_ppo_hyperparameters(bad)
    with pytest.raises(ValueError, match="policy_loss"):
        make_ppo_hyperparameters({"policy_loss": "trpo"})
    with pytest.raises(ValueError, match="loss_agg_mode"):
        make_ppo_hyperparameters({"loss_agg_mode": "sum"})


RATIO = 1.25  # above 1 + 0.2, below 1 + 0.28


@pytest.mark.parametrize("eps_clip_high", [None, 0.28])
def test_clip_higher_lets_a_rising_ratio_through(tokenizer, eps_clip_high):
    """Old log-probs set so every response token's importance ratio is 1.25 at the update. A
    token is clipped when -A * clip(r) > -A * r: for A > 0 when r > 1 + eps_high, for A < 0 when
    r < 1 - eps_low. So with eps_clip = 0.2 exactly the positive-advantage tokens are clipped,
    and with clip-higher (eps_clip_high = 0.28) none is."""
    actor = make_model(tokenizer)
    opts = dict(eps_clip=0.2, eps_clip_high=eps_clip_high, early_stop_imp_ratio=None, kl_loss_coef=0.0)
    a, adv = iface("ppo_actor", **opts), iface("ppo_advantages", **opts)
    assert a.hp.loss_config().eps_clip_high == (0.2 if eps_clip_high is None else 0.28)
    data = rollout_with_advantages(tokenizer, actor, a, adv)
    mask = data.data["ppo_loss_mask"]
    current = a.inference(actor, data).data["packed_ref_logprobs"]
    data.data["packed_logprobs"] = torch.where(mask, current - math.log(RATIO), current)
    advantages = data.data["advantages"]
    assert (advantages[mask] != 0).all()
    stats = a.train_step(actor, data)
    assert stats["n_updates"] == 1
    assert stats["importance_ratio"] == pytest.approx(RATIO, rel=1e-4)
    positive_frac = float((advantages[mask] > 0).float().mean())
    assert 0 < positive_frac < 1
    expected = positive_frac if eps_clip_high is None else 0.0
    assert stats["clip_frac"] == pytest.approx(expected, abs=1e-6)


def test_first_minibatch_ratio_shows_generation_and_training_agree(tokenizer):
    """The first minibatch meets the policy that sampled it: its token ratios are 1 up to float
    error. A rollout whose log-probs disagree with the training forward shows in the statistic."""
    actor = make_model(tokenizer, lr=3e-3)
    a, adv = iface("ppo_actor", ppo_n_minibatches=2), iface("ppo_advantages")
    data = rollout_with_advantages(tokenizer, actor, a, adv)
    stats = a.train_step(actor, data)
    assert 0.0 <= stats["first_mb_ratio_max_dev"] < 1e-4  # fp32 on a CPU: the same numbers
    assert "ratio_dev_max" not in stats
    actor = make_model(tokenizer, lr=3e-3)
    skewed = rollout_with_advantages(tokenizer, actor, a, adv)
    mask = skewed.data["ppo_loss_mask"].bool()
    skewed.data["packed_logprobs"] = skewed.data["packed_logprobs"] + 0.2 * mask  # the sampler's, off by 0.2
    stats = a.train_step(actor, skewed)
    assert stats["first_mb_ratio_max_dev"] == pytest.approx(1 - math.exp(-0.2), abs=1e-4)
