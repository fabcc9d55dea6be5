"""The actor's train step with each of verl's other policy losses (the math is tested in
tests/model/test_policy_losses_verl.py): one update on fresh samples raises the log-likelihood of
the answers with positive advantages and lowers the others, through the real train engine."""

from __future__ import annotations

import pytest
from interface_fixtures import make_model
from test_policy_loss_actor import iface, per_answer_sums, rollout_with_advantages

CASES = {
    "vanilla": {},
    "cispo": {"eps_clip": 10.0, "eps_clip_high": 0.2},
    "gpg": {},
    "dro": {"policy_loss_options": {"dro_beta": 0.05}},
    "dppo_tv": {},
    "dppo_kl": {},
    "geo_mean": {"eps_clip": 0.4, "eps_clip_high": 0.4, "loss_agg_mode": "seq-mean-token-mean"},
    "sapo": {"loss_agg_mode": "seq-mean-token-mean"},
    "clip_cov": {},
    "kl_cov": {},
}


@pytest.mark.parametrize("policy_loss", sorted(CASES))
def test_one_step_with_each_loss(tokenizer, policy_loss):
    actor = make_model(tokenizer, lr=3e-3)
    opts = dict(policy_loss=policy_loss, kl_loss_coef=0.0, early_stop_imp_ratio=None, ppo_n_minibatches=1)
    opts.update(CASES[policy_loss])
    a, adv = iface("ppo_actor", **opts), iface("ppo_advantages", **opts)
    assert a.hp.policy_loss == policy_loss
    data = rollout_with_advantages(tokenizer, actor, a, adv)
    mask = data.data["ppo_loss_mask"]
    adv_seq = per_answer_sums(data.data["advantages"] * mask, data)
    before = a.inference(actor, data).data["packed_ref_logprobs"]
    stats = a.train_step(actor, data)
    after = a.inference(actor, data).data["packed_ref_logprobs"]
    delta = per_answer_sums((after - before) * mask, data)
    pos, neg = adv_seq > 0, adv_seq < 0
    assert pos.any() and neg.any()
    assert float(delta[pos].mean()) > 0 > float(delta[neg].mean())
    assert stats["importance_ratio"] == pytest.approx(1.0, abs=1e-4)
    assert actor.version.global_step == 1
