"""The actor's train step measuring and correcting the training-inference mismatch
(``ppo.recompute_logprobs``, ``ppo.rollout_correction``) on a tiny ReaLModel in-process."""

from __future__ import annotations

import math
from unittest import mock

import pytest
import torch
from interface_fixtures import make_model, prompt_batch

from realrl.api.core.config import ModelInterfaceAbstraction, ModelName
from realrl.api.core.model_api import Model, make_interface
from realrl.impl.interface.common import per_sequence_sample
from realrl.impl.interface.ppo_actor import ROLLOUT_IS_WEIGHTS
from realrl.impl.model.utils.rl_registry import policy_loss_names

PROMPTS = ["w1 w2", "w3"]
GEN = {"max_new_tokens": 6, "min_new_tokens": 2, "top_p": 1.0, "top_k": 0, "n": 4}
REWARDS = [0.5, -1.0, 2.0, 0.0, 1.5, 1.0, -0.5, 3.0]
BASE = dict(kl_loss_coef=0.0, early_stop_imp_ratio=None, ppo_n_minibatches=1, gen=GEN)
# the rollout's log-probs are the trainer's minus these, cycled over the response tokens
DELTAS = torch.tensor([0.0, 0.5, -0.4, 1.2])


def iface(name, **ppo):
    return make_interface(ModelInterfaceAbstraction(name, {"ppo": {**BASE, **ppo}, "preset": "grpo"}))


def batch(tokenizer, actor, a, adv, deltas=None):
    """actor_gen -> rewards -> compute_adv; with ``deltas`` the rollout's log-probs are moved off
    the trainer's by known amounts. Returns (data, the trainer's log-probs, the log ratio)."""
    torch.manual_seed(0)
    data = a.generate(actor, prompt_batch(tokenizer, PROMPTS))
    data.update_(a.inference(actor, data))  # the reference: the actor itself
    data.update_(per_sequence_sample(data, "rewards", torch.tensor(REWARDS)))
    data.update_(adv.inference(Model(ModelName("adv"), None, tokenizer), data)[0])
    train = data.data["packed_ref_logprobs"].clone()
    mask = data.data["ppo_loss_mask"]
    log_ratio = torch.zeros_like(train)
    if deltas is not None:
        log_ratio[mask] = deltas.repeat(int(mask.sum()) // len(deltas) + 1)[: int(mask.sum())]
        data.data["packed_logprobs"] = train - log_ratio
    return data, train, log_ratio


def forward_calls(actor, a, data):
    with mock.patch.object(actor.module, "forward", wraps=actor.module.forward) as spy:
        stats = a.train_step(actor, data)
    return spy.call_count, stats


def test_off_by_default_no_extra_forward_and_no_statistics(tokenizer):
    actor = make_model(tokenizer)
    a, adv = iface("ppo_actor"), iface("ppo_advantages")
    assert not a.measures_mismatch
    data, _, _ = batch(tokenizer, actor, a, adv)
    calls, stats = forward_calls(actor, a, data)
    assert calls == 0
    assert not [k for k in stats if k.startswith("rollout_corr/")]


def test_recompute_measures_the_mismatch_with_one_forward(tokenizer):
    actor = make_model(tokenizer)
    a, adv = iface("ppo_actor", recompute_logprobs=True), iface("ppo_advantages")
    data, _, _ = batch(tokenizer, actor, a, adv)
    calls, stats = forward_calls(actor, a, data)
    assert calls == 1
    # the decoder and the trainer are one model in fp32 on the CPU: rounding at most
    assert abs(stats["rollout_corr/kl"]) < 1e-5 and stats["rollout_corr/k3_kl"] < 1e-6
    assert stats["rollout_corr/log_ratio_abs_max"] < 1e-4
    assert stats["rollout_corr/ppl_ratio"] == pytest.approx(1.0, abs=1e-5)
    assert abs(stats["rollout_corr/chi2_token"]) < 1e-4
    assert ROLLOUT_IS_WEIGHTS not in data.data  # measured, not corrected


def test_token_is_and_rejection_weight_the_loss(tokenizer):
    """Rollout log-probs off by 0, 0.5, -0.4, 1.2 per token: token_k2 <= 0.5 drops the 1.2s, the
    others weigh min(e^delta, 2); the first update's ratio is 1 (anchored at the recomputation),
    so its token-mean loss is -sum(w A) / #kept."""
    actor = make_model(tokenizer)
    corr = dict(rollout_is="token", rollout_is_threshold=2.0, rollout_rs="token_k2", rollout_rs_threshold=0.5)
    a, adv = iface("ppo_actor", rollout_correction=corr), iface("ppo_advantages")
    assert a.measures_mismatch
    data, _, log_ratio = batch(tokenizer, actor, a, adv, DELTAS)
    mask, advantages = data.data["ppo_loss_mask"].clone(), data.data["advantages"].clone()
    calls, stats = forward_calls(actor, a, data)
    assert calls == 1
    kept = mask & (log_ratio.abs() < 1.0)
    assert torch.equal(data.data["ppo_loss_mask"].bool(), kept)
    expected_w = torch.where(mask, log_ratio.exp().clamp(max=2.0), torch.zeros_like(log_ratio))
    torch.testing.assert_close(data.data[ROLLOUT_IS_WEIGHTS], expected_w, rtol=1e-4, atol=1e-5)
    assert stats["loss"] == pytest.approx(
        float(-(advantages * expected_w)[kept].sum() / kept.sum()), rel=1e-4
    )
    assert stats["importance_ratio"] == pytest.approx(1.0, abs=1e-4)
    assert stats["rollout_corr/kl"] == pytest.approx(float(-log_ratio[mask].mean()), rel=1e-4)
    k3 = log_ratio.exp() - 1 - log_ratio
    assert stats["rollout_corr/k3_kl"] == pytest.approx(float(k3[mask].mean()), rel=1e-4)
    assert stats["rollout_corr/log_ratio_abs_max"] == pytest.approx(1.2, rel=1e-4)
    assert stats["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(
        1 - float(kept.sum() / mask.sum())
    )
    assert stats["rollout_corr/rollout_is_mean"] == pytest.approx(float(expected_w[mask].mean()), rel=1e-4)


@pytest.mark.parametrize("rollout_is", [None, "token"])
def test_with_the_decoupled_objective_one_weight_not_two(tokenizer, rollout_is):
    """The proximal policy is the recomputation; rollout_is replaces AReaL's pi_prox / pi_behav
    weight (the same ratio), without it AReaL's weight stays."""
    actor = make_model(tokenizer)
    opts = dict(decoupled_loss=True, recompute_logprobs=True, rollout_correction={"rollout_is": rollout_is})
    a, adv = iface("ppo_actor", **opts), iface("ppo_advantages", **opts)
    data, _, log_ratio = batch(tokenizer, actor, a, adv, DELTAS)
    stats = a.train_step(actor, data)
    assert stats["stale_answers"] == 0.0
    assert ("behav_imp_weight" in stats) == (rollout_is is None)
    if rollout_is is None:
        mask = data.data["ppo_loss_mask"]
        assert stats["behav_imp_weight"] == pytest.approx(float(log_ratio[mask].exp().mean()), rel=1e-4)


def test_bypass_mode_rejects_in_the_loss_without_an_extra_forward(tokenizer):
    actor = make_model(tokenizer)
    corr = dict(bypass_mode=True, rollout_rs="token_k1", rollout_rs_threshold=math.exp(1.0))
    a, adv = iface("ppo_actor", rollout_correction=corr), iface("ppo_advantages")
    data, _, log_ratio = batch(tokenizer, actor, a, adv, DELTAS)
    calls, stats = forward_calls(actor, a, data)
    assert calls == 0
    mask = data.data["ppo_loss_mask"]
    dropped = float((log_ratio[mask].abs() > 1.0).float().mean())
    assert stats["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(dropped, abs=1e-6)
    assert stats["rollout_corr/log_ratio_abs_max"] == pytest.approx(1.2, rel=1e-4)
    with pytest.raises(ValueError, match="choose one"):
        iface("ppo_actor", recompute_logprobs=True, rollout_correction={"bypass_mode": True})


def test_the_cli_accepts_the_options(tmp_path):
    from realrl.apps.configs import build_config
    from realrl.apps.errors import UserError

    cfg = build_config(
        "grpo",
        [
            f"fileroot={tmp_path}",
            "ppo.recompute_logprobs=true",
            "ppo.rollout_correction.rollout_is=token",
            "ppo.rollout_correction.rollout_is_threshold=2.0",
            "ppo.rollout_correction.rollout_rs=token_k1,seq_mean_k3",
            "ppo.rollout_correction.rollout_rs_threshold='0.5_2.0,0.01'",
        ],
    )
    corr = cfg.ppo.rollout_correction
    assert cfg.ppo.recompute_logprobs
    assert (corr.rollout_is, corr.rollout_is_threshold, corr.rollout_rs) == (
        "token",
        2.0,
        "token_k1,seq_mean_k3",
    )
    assert [r.option for r in corr.rejection_rules()] == ["token_k1", "seq_mean_k3"]
    with pytest.raises(UserError, match="rollout_is='tokens'"):
        build_config("grpo", [f"fileroot={tmp_path}", "ppo.rollout_correction.rollout_is=tokens"])


@pytest.mark.parametrize("policy_loss", policy_loss_names())
def test_every_registered_policy_loss_takes_the_correction(tokenizer, policy_loss):
    """The weights and the rejection enter beside the loss, so every loss trains with them."""
    actor = make_model(tokenizer)
    corr = dict(rollout_is="sequence", rollout_rs="token_k2", rollout_rs_threshold=0.5)
    opts = {"policy_loss_options": {"dro_beta": 0.05}} if policy_loss == "dro" else {}
    a = iface("ppo_actor", policy_loss=policy_loss, rollout_correction=corr, **opts)
    data, _, log_ratio = batch(tokenizer, actor, a, iface("ppo_advantages"), DELTAS)
    mask = data.data["ppo_loss_mask"].clone()
    stats = a.train_step(actor, data)
    assert math.isfinite(stats["loss"]) and stats["n_updates"] == 1.0
    assert torch.equal(data.data["ppo_loss_mask"].bool(), mask & (log_ratio.abs() < 1.0))
    assert stats["rollout_corr/rollout_is_mean"] > 0
