"""ppo_advantages (the ``compute_adv`` node) on tiny ReaLModels: one advantage computation per
batch that the actor's and the critic's updates both read, every registered estimator behind its
preset, DAPO's overlong shaping, the KL-in-reward check, and the saved state."""

from __future__ import annotations

import io

import pytest
import torch
from interface_fixtures import make_model, prompt_batch

from realrl.api.core.config import ModelInterfaceAbstraction, ModelName
from realrl.api.core.data_api import SequenceSample
from realrl.api.core.model_api import GenerationOutput, Model, make_interface
from realrl.impl.interface.common import per_sequence_sample, token_minus_one_sample
from realrl.impl.interface.ppo_advantages import AdvantageInterface
from realrl.impl.interface.ppo_config import PPOHyperparameters, make_ppo_hyperparameters
from realrl.impl.interface.ppo_keys import advantage_inputs, advantage_outputs
from realrl.impl.interface.ppo_rollout import overlong_penalties, rollout_sample
from realrl.impl.model.utils import advantages as A
from realrl.impl.model.utils import ppo_functional as F
from realrl.impl.model.utils.functional import shifted_token_mask

PROMPTS = ["w1 w2", "w3", "w4 w5 w6", "w7"]
GEN = {"max_new_tokens": 6, "min_new_tokens": 1, "top_p": 1.0, "top_k": 0}
BUILTIN_ESTIMATORS = ("gae", "grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "remax")
# distinct scores within each group of 4 answers
GROUP_REWARDS = [0.5, -1.0, 2.0, 0.0, 1.5, 1.0, -0.5, 3.0]


def iface(name, preset=None, **ppo):
    ppo.setdefault("gen", GEN)
    return make_interface(ModelInterfaceAbstraction(name, {"ppo": ppo, "preset": preset}))


def null_model(tokenizer):
    """What ``compute_adv`` runs on: no module, the tokenizer only."""
    return Model(ModelName("adv"), None, tokenizer)


def compute_adv(tokenizer, adv_if, data):
    out, stats = adv_if.inference(null_model(tokenizer), data)
    data.update_(out)
    return out, stats


def rollout(tokenizer, actor, actor_if, prompts, rewards, ref=None, critic=None, critic_if=None):
    """actor_gen -> rew (given) -> ref_inf (``ref``, else the actor itself) -> critic_inf."""
    torch.manual_seed(0)
    out = actor_if.generate(actor, prompt_batch(tokenizer, prompts))
    out.update_(actor_if.inference(actor if ref is None else ref, out))
    out.update_(per_sequence_sample(out, "rewards", torch.tensor(rewards, dtype=torch.float32)))
    if critic is not None:
        out.update_(critic_if.inference(critic, out))
    return out


def per_answer(x, data):
    """[T - N] -> one tensor per answer."""
    return x.split([n - 1 for n in data.flat_seqlens("packed_input_ids")])


# ----------------------------------------------------------------------------- (a) one computation


def _spy_on_updates(model):
    """Record the minibatches the model's engine is asked to train on."""
    seen, train_batch = [], model.module.train_batch

    def spy(input_, **kw):
        seen.append(input_)
        return train_batch(input_=input_, **kw)

    model.module.train_batch = spy
    return seen


def test_actor_and_critic_read_one_advantage_computation(tokenizer):
    actor, critic = make_model(tokenizer), make_model(tokenizer, role="critic", critic=True)
    opts = dict(value_norm=False, adv_norm=False, ppo_n_minibatches=2, early_stop_imp_ratio=None)
    a, c, adv = iface("ppo_actor", **opts), iface("ppo_critic", **opts), iface("ppo_advantages", **opts)
    assert advantage_inputs(adv.hp) == (
        "packed_input_ids",
        "packed_logprobs",
        "prompt_mask",
        "seq_no_eos_mask",
        "packed_ref_logprobs",
        "rewards",
        "values",
    )
    data = rollout(tokenizer, actor, a, PROMPTS, [1.0, -1.0, 0.5, 2.0], critic=critic, critic_if=c)
    with pytest.raises(ValueError, match="advantages"):
        a.train_step(actor, data)  # the actor no longer computes them itself
    with pytest.raises(ValueError, match="old_values"):
        c.train_step(critic, data)
    prepared, stats = compute_adv(tokenizer, adv, data)
    assert prepared.keys == set(advantage_outputs(adv.hp))
    assert prepared.keys == {"advantages", "ppo_loss_mask", "kl_rewards", "returns", "old_values"}
    cu = data.cu_seqlens("packed_input_ids")
    mask = prepared.data["ppo_loss_mask"]
    torch.testing.assert_close(mask, F.response_loss_mask(data.data["prompt_mask"], cu))
    # GAE without value norm: the critic's target is the actor's advantage plus the old value
    values = data.data["values"][shifted_token_mask(cu)]
    adv_t, ret_t = prepared.data["advantages"], prepared.data["returns"]
    torch.testing.assert_close(ret_t[mask], adv_t[mask] + values[mask])
    assert (adv_t[~mask] == 0).all() and (ret_t[~mask] == 0).all()
    torch.testing.assert_close(prepared.data["old_values"], data.data["values"])
    assert stats["advantage_mean"] == pytest.approx(float(adv_t[mask].mean()), rel=1e-5, abs=1e-6)

    seen_actor, seen_critic = _spy_on_updates(actor), _spy_on_updates(critic)
    a.train_step(actor, data)
    c.train_step(critic, data)
    assert len(seen_actor) == len(seen_critic) == 2
    # the same minibatches (one shuffle seed), reading the batch's one set of advantages / targets
    assert [mb.ids for mb in seen_actor] == [mb.ids for mb in seen_critic]
    by_id = {s.ids[0]: s for s in data.unpack()}
    for mb_a, mb_c in zip(seen_actor, seen_critic):
        for sa, sc in zip(mb_a.unpack(), mb_c.unpack()):
            whole = by_id[sa.ids[0]]
            assert torch.equal(sa.data["advantages"], whole.data["advantages"])
            assert torch.equal(sa.data["ppo_loss_mask"], sc.data["ppo_loss_mask"])
            assert torch.equal(sc.data["returns"], whole.data["returns"])
            assert torch.equal(sc.data["old_values"], whole.data["old_values"])


def test_minibatch_whitening_scope_whitens_in_the_actor_update(tokenizer):
    """PPO detail 9 with ``whiten_scope="minibatch"``: compute_adv leaves the advantages as the
    estimator gives them and each of the actor's minibatches whitens its own."""
    actor, critic = make_model(tokenizer), make_model(tokenizer, role="critic", critic=True)
    opts = dict(value_norm=False, whiten_scope="minibatch", ppo_n_minibatches=2, ppo_n_epochs=2)
    a, c = iface("ppo_actor", **opts), iface("ppo_critic", **opts)
    data = rollout(tokenizer, actor, a, PROMPTS, [1.0, -1.0, 0.5, 2.0], critic=critic, critic_if=c)
    unwhitened, _ = iface("ppo_advantages", **{**opts, "adv_norm": False}).inference(
        null_model(tokenizer), data
    )
    prepared, _ = compute_adv(tokenizer, iface("ppo_advantages", **opts), data)
    torch.testing.assert_close(prepared.data["advantages"], unwhitened.data["advantages"])
    seen = _spy_on_updates(actor)
    a.train_step(actor, data)
    assert len(seen) == 4  # 2 epochs x 2 minibatches
    by_id = {s.ids[0]: s for s in data.unpack()}
    for mb in seen:
        whole = SequenceSample.gather([by_id[i] for i in mb.ids])  # the batch's entries, in mb's order
        mask = mb.data["ppo_loss_mask"]
        expected = F.whiten(whole.data["advantages"], shift_mean=True, mask=mask)
        torch.testing.assert_close(mb.data["advantages"], expected)
        assert float(mb.data["advantages"][mask].mean()) == pytest.approx(0.0, abs=1e-5)
    assert torch.equal(data.data["advantages"], prepared.data["advantages"])  # the batch is untouched


# ----------------------------------------------------------------------------- (b) estimators


def _baseline_rewards(data: SequenceSample, scores: list[float]) -> SequenceSample:
    """ReMax's ``baseline_rewards``: one score per prompt (its greedy answer's)."""
    return SequenceSample(
        keys={"baseline_rewards"},
        trailing_shapes={"baseline_rewards": ()},
        dtypes={"baseline_rewards": torch.float32},
        ids=list(data.ids),
        seqlens={"baseline_rewards": [[1] for _ in data.ids]},
        data={"baseline_rewards": torch.tensor(scores, dtype=torch.float32)},
    )


ESTIMATOR_CASES = {
    # case: (preset, overrides, estimator function)
    "grpo": ("grpo", {}, A.grpo_advantages),
    "dr_grpo": ("dr_grpo", {}, A.grpo_advantages),
    "rloo": ("rloo", {}, A.rloo_advantages),
    "reinforce_pp": ("reinforce_pp", {}, A.reinforce_pp_advantages),
    "reinforce_pp_baseline": (
        "reinforce_pp",
        {"adv_estimator": "reinforce_pp_baseline"},
        A.reinforce_pp_baseline_advantages,
    ),
    "remax": ("remax", {}, A.remax_advantages),
}


def test_every_builtin_estimator_is_registered_and_covered():
    names = set(A.adv_estimator_names())
    assert set(BUILTIN_ESTIMATORS) <= names
    covered = {"gae"} | {make_ppo_hyperparameters(o, p).adv_estimator for p, o, _ in ESTIMATOR_CASES.values()}
    assert covered == set(BUILTIN_ESTIMATORS)


@pytest.mark.parametrize("case", list(ESTIMATOR_CASES))
def test_estimator_through_compute_adv_matches_a_direct_call(tokenizer, case):
    preset, overrides, fn = ESTIMATOR_CASES[case]
    actor, ref = make_model(tokenizer), make_model(tokenizer, role="ref", seed=1, train=False)
    gen = {**GEN, "n": 4}
    a = iface("ppo_actor", preset, gen=gen, **overrides)
    adv = iface("ppo_advantages", preset, gen=gen, **overrides)
    hp = adv.hp
    assert not hp.uses_critic and not hp.adv_norm  # the presets: no critic, no extra whitening
    data = rollout(tokenizer, actor, a, PROMPTS[:2], GROUP_REWARDS, ref=ref)  # KL != 0
    baseline = None
    if hp.estimator.needs_baseline:
        with pytest.raises(ValueError, match="baseline_rewards"):
            adv.inference(null_model(tokenizer), data)
        data.update_(_baseline_rewards(data, [0.25, 2.0]))
        baseline = torch.tensor([0.25] * 4 + [2.0] * 4)
    kl_coef = hp.kl_ctl
    assert (kl_coef > 0) == (hp.adv_estimator != "grpo")  # the KL in the reward, or in the loss
    prepared, stats = compute_adv(tokenizer, adv, data)
    assert "returns" not in prepared.keys and "old_values" not in prepared.keys

    cu = data.cu_seqlens("packed_input_ids")
    mask = F.response_loss_mask(data.data["prompt_mask"], cu)
    old, refp = data.data["packed_logprobs"], data.data["packed_ref_logprobs"]
    scores = data.data["rewards"].float()  # no scaling, inside the clip
    kl_rewards, token_rewards = F.packed_kl_rewards(kl_coef, old, refp, scores, cu, mask, "k1")
    expected, _ = fn(
        A.AdvantageInputs(
            token_rewards=token_rewards,
            scores=scores,
            loss_mask=mask,
            cu_seqlens=cu,
            group_sizes=[4, 4],
            baseline_scores=baseline,
            discount=hp.discount,
            gae_lambda=hp.gae_lambda,
            scale_by_std=hp.grpo_scale_by_std,
        )
    )
    got = prepared.data["advantages"]
    torch.testing.assert_close(got, expected.float())
    torch.testing.assert_close(prepared.data["kl_rewards"], kl_rewards.float())
    assert (got[~mask] == 0).all() and got[mask].abs().sum() > 0
    if kl_coef > 0:
        assert prepared.data["kl_rewards"][mask].abs().sum() > 0
    assert stats["kl_coef"] == pytest.approx(kl_coef)
    # and the actor trains on them
    st = a.train_step(actor, data)
    assert st["n_updates"] == hp.ppo_n_epochs * hp.ppo_n_minibatches


def test_outcome_estimators_give_one_advantage_per_answer(tokenizer):
    actor = make_model(tokenizer)
    a = iface("ppo_actor", "grpo", gen={**GEN, "n": 4})
    adv = iface("ppo_advantages", "grpo", gen={**GEN, "n": 4})
    data = rollout(tokenizer, actor, a, PROMPTS[:2], GROUP_REWARDS)
    prepared, _ = compute_adv(tokenizer, adv, data)
    per_seq = []
    for x, m in zip(
        per_answer(prepared.data["advantages"], data), per_answer(prepared.data["ppo_loss_mask"], data)
    ):
        assert torch.allclose(x[m], x[m][0].expand_as(x[m]))
        per_seq.append(x[m][0])
    expected = F.group_normalized_advantages(torch.tensor(GROUP_REWARDS), [4, 4])
    torch.testing.assert_close(torch.stack(per_seq), expected)


# ----------------------------------------------------------------------------- (c) overlong shaping

RESPONSE_LENGTHS = [3, 5, 8]
PROMPT = [5, 6]


def _hand_rollout() -> SequenceSample:
    """One prompt of 2 tokens with three answers of 3, 5 and 8 tokens; old = reference log-probs."""
    seqs = [PROMPT + [9 + (i % 20) for i in range(n)] for n in RESPONSE_LENGTHS]
    lens = [len(s) for s in seqs]
    gen = GenerationOutput(
        sequences=torch.tensor(sum(seqs, [])),
        seqlens=lens,
        prompt_lens=[len(PROMPT)] * len(seqs),
        logprobs=-torch.ones(sum(n - 1 for n in lens)),
        no_eos=torch.tensor([False, False, True]),
    )
    prompts = SequenceSample.from_default(ids=[0], seqlens=[2], data={"packed_prompts": torch.tensor(PROMPT)})
    data = rollout_sample(prompts, gen)
    data.update_(token_minus_one_sample(data, "packed_ref_logprobs", data.data["packed_logprobs"].clone()))
    data.update_(per_sequence_sample(data, "rewards", torch.ones(3)))
    return data


def test_overlong_penalties_by_hand():
    data = _hand_rollout()
    cu = data.cu_seqlens("packed_input_ids")
    mask = F.response_loss_mask(data.data["prompt_mask"], cu)
    assert mask.sum() == sum(RESPONSE_LENGTHS)
    penalty = overlong_penalties(mask, cu, max_new_tokens=8, buffer=4, penalty=1.0)
    torch.testing.assert_close(penalty, torch.tensor([0.0, 0.25, 1.0]))
    # linear in the penalty; a zero buffer penalises nothing up to the length limit
    torch.testing.assert_close(overlong_penalties(mask, cu, 8, 4, 2.0), torch.tensor([0.0, 0.5, 2.0]))
    torch.testing.assert_close(overlong_penalties(mask, cu, 8, 0, 1.0), torch.zeros(3))


def test_overlong_shaping_through_compute_adv(tokenizer):
    gen = {"max_new_tokens": 8, "min_new_tokens": 1, "top_p": 1.0, "top_k": 0, "n": 3}
    adv = iface("ppo_advantages", "dapo", gen=gen, overlong_buffer_ratio=0.5, overlong_penalty=1.0)
    assert adv.hp.adv_estimator == "grpo" and adv.hp.clip_high == 0.28
    data = _hand_rollout()
    _, stats = adv.inference(null_model(tokenizer), data)
    assert stats["overlong_penalty"] == pytest.approx((0.0 + 0.25 + 1.0) / 3)
    assert stats["score"] == pytest.approx(1.0)  # the shaped score before the length penalty
    # equal rewards: the advantages come from the length penalty alone
    shaped = torch.tensor([1.0, 0.75, 0.0])
    expected = F.group_normalized_advantages(shaped, [3])
    out = _hand_rollout()
    prepared, _ = adv.inference(null_model(tokenizer), out)
    per_seq = [
        x[m].mean()
        for x, m in zip(
            per_answer(prepared.data["advantages"], out), per_answer(prepared.data["ppo_loss_mask"], out)
        )
    ]
    torch.testing.assert_close(torch.stack(per_seq), expected)
    # without the buffer: equal scores, zero advantages, no stat
    plain = iface("ppo_advantages", "dapo", gen=gen, overlong_buffer_ratio=None)
    prepared, stats = plain.inference(null_model(tokenizer), _hand_rollout())
    assert "overlong_penalty" not in stats
    assert (prepared.data["advantages"] == 0).all()


def _without_reference(data: SequenceSample) -> SequenceSample:
    return data.select([k for k in data.keys if k != "packed_ref_logprobs"])


def test_without_a_kl_term_no_reference_is_read_and_none_reported(tokenizer):
    gen = {**GEN, "n": 3}
    free = iface("ppo_advantages", "dr_grpo", gen=gen)
    assert not free.hp.uses_reference
    with_ref, stats_with = free.inference(null_model(tokenizer), _hand_rollout())
    alone, stats_alone = free.inference(null_model(tokenizer), _without_reference(_hand_rollout()))
    for key in ("advantages", "ppo_loss_mask", "kl_rewards"):
        torch.testing.assert_close(alone.data[key], with_ref.data[key])
    assert (alone.data["kl_rewards"] == 0).all()
    assert "ref_kl" not in stats_alone and "ref_kl" not in stats_with
    # GRPO's KL loss reads the reference: a batch without it is refused, naming the key
    kl_loss = iface("ppo_advantages", "grpo", gen=gen)
    assert kl_loss.hp.uses_reference
    with pytest.raises(Exception, match="packed_ref_logprobs"):
        kl_loss.inference(null_model(tokenizer), _without_reference(_hand_rollout()))
    _, stats = kl_loss.inference(null_model(tokenizer), _hand_rollout())
    assert stats["ref_kl"] == pytest.approx(0.0)  # the hand rollout's reference is the policy


def test_dapo_preset_shapes_the_last_fifth_of_the_budget():
    hp = make_ppo_hyperparameters(preset="dapo")
    assert hp.overlong_buffer_ratio == 0.2 and hp.overlong_penalty == 1.0
    for bad in (-1, 0, 1.5):
        with pytest.raises(ValueError, match="overlong_buffer_ratio"):
            make_ppo_hyperparameters({"overlong_buffer_ratio": bad})


# ----------------------------------------------------------------------------- (d) KL in the reward


def test_estimators_without_kl_in_reward_reject_a_kl_coefficient():
    no_kl = [n for n in BUILTIN_ESTIMATORS if not A.get_adv_estimator(n).kl_in_reward]
    assert no_kl == ["grpo"]
    for name in no_kl:
        with pytest.raises(ValueError, match="kl_ctl=0"):
            PPOHyperparameters(adv_estimator=name, kl_ctl=0.1)
        with pytest.raises(ValueError, match="kl_ctl=0"):
            PPOHyperparameters(adv_estimator=name, kl_ctl=0.0, adaptive_kl_ctl=True)
        assert PPOHyperparameters(adv_estimator=name, kl_ctl=0.0, kl_loss_coef=0.04).kl_loss_coef == 0.04
    for preset in ("grpo", "dr_grpo", "dapo", "gspo"):
        assert make_ppo_hyperparameters(preset=preset).kl_ctl == 0.0
        with pytest.raises(ValueError, match="kl_ctl=0"):
            make_ppo_hyperparameters({"kl_ctl": 0.1}, preset)
        with pytest.raises(ValueError, match="kl_ctl=0"):
            AdvantageInterface(ppo={"kl_ctl": 0.1}, preset=preset)
    for name in set(BUILTIN_ESTIMATORS) - set(no_kl):  # the others take a KL reward
        assert PPOHyperparameters(adv_estimator=name, kl_ctl=0.1).kl_ctl == 0.1


def test_kl_coef_stat_is_the_coefficient_the_batch_was_penalised_with(tokenizer):
    actor, ref = make_model(tokenizer), make_model(tokenizer, role="ref", seed=1, train=False)
    opts = dict(
        adv_estimator="rloo",
        adaptive_kl_ctl=True,
        kl_ctl=0.2,
        adaptive_kl_target=0.5,
        adaptive_kl_horizon=100,
    )
    a, adv = iface("ppo_actor", **opts), iface("ppo_advantages", **opts)
    data = rollout(tokenizer, actor, a, PROMPTS, [1.0, -1.0, 0.5, 2.0], ref=ref)
    _, stats = adv.inference(null_model(tokenizer), data)
    assert stats["kl_coef_next"] != pytest.approx(0.2)  # the controller moved
    assert stats["kl_coef"] == pytest.approx(0.2)


# ----------------------------------------------------------------------------- (e) state


def test_state_dict_round_trip_restores_kl_coefficient_and_moments(tokenizer):
    actor, ref = make_model(tokenizer), make_model(tokenizer, role="ref", seed=1, train=False)
    critic = make_model(tokenizer, role="critic", critic=True)
    opts = dict(
        adaptive_kl_ctl=True, kl_ctl=0.2, adaptive_kl_target=0.5, adaptive_kl_horizon=100, value_norm=True
    )
    a, c, adv = iface("ppo_actor", **opts), iface("ppo_critic", **opts), iface("ppo_advantages", **opts)
    data = rollout(tokenizer, actor, a, PROMPTS, [1.0, -1.0, 0.5, 2.0], ref=ref, critic=critic, critic_if=c)
    for _ in range(2):
        adv.inference(null_model(tokenizer), data)
    state = adv.state_dict()
    assert set(state) == {"kl_coef", "value_norm"}
    assert state["kl_coef"] != pytest.approx(0.2)  # the controller moved
    assert state["value_norm"]["debias"] > 0 and state["value_norm"]["count"] > 0
    # through a file, as a recover checkpoint stores it
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    restored = iface("ppo_advantages", **opts)
    assert restored.state_dict() != state
    restored.load_state_dict(torch.load(buf))
    assert restored.state_dict() == state
    assert restored.kl_ctl.value == adv.kl_ctl.value and restored.rms == adv.rms
    # and it then computes what the original computes
    out_a, st_a = adv.inference(null_model(tokenizer), data)
    out_b, st_b = restored.inference(null_model(tokenizer), data)
    for k in out_a.keys:
        assert torch.equal(out_a.data[k], out_b.data[k]), k
    assert st_a == st_b and restored.state_dict() == adv.state_dict()
