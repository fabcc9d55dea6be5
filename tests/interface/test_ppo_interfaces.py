"""ppo_actor, ppo_critic, ppo_advantages, grpo_actor and generation on tiny ReaLModels behind the
real engines. Advantages are computed once per batch by ``ppo_advantages`` (the ``compute_adv``
node) and ``update_``-d into the batch before the train steps, as the graph runs them."""

import contextlib
import dataclasses
import json

import pytest
import torch
from interface_fixtures import make_model, prompt_batch

from realrl.api.core.config import ModelInterfaceAbstraction, ModelName
from realrl.api.core.data_api import SequenceSample
from realrl.api.core.model_api import GenerationOutput, Model, make_interface
from realrl.impl.interface.common import per_sequence_sample, token_sample
from realrl.impl.interface.ppo_config import make_ppo_hyperparameters
from realrl.impl.interface.ppo_rollout import (
    rollout_kl,
    rollout_sample,
    shape_scores,
    shuffled_minibatches,
    truncate_generation,
)
from realrl.impl.model.utils import ppo_functional as F
from realrl.impl.model.utils.functional import shifted_token_mask
from realrl.system.recover_state import stateful

PROMPTS = ["w1 w2", "w3", "w4 w5 w6", "w7"]
GEN = {"max_new_tokens": 6, "min_new_tokens": 1, "top_p": 1.0, "top_k": 0}


def actor_iface(name="ppo_actor", **ppo):
    ppo.setdefault("gen", GEN)
    return make_interface(ModelInterfaceAbstraction(name, {"ppo": ppo}))


def critic_iface(**ppo):
    return make_interface(ModelInterfaceAbstraction("ppo_critic", {"ppo": ppo}))


def adv_iface(preset=None, **ppo):
    ppo.setdefault("gen", GEN)
    return make_interface(ModelInterfaceAbstraction("ppo_advantages", {"ppo": ppo, "preset": preset}))


def null_model(tokenizer):
    """What ``compute_adv`` runs on: no module, the tokenizer only."""
    return Model(ModelName("adv"), None, tokenizer)


def compute_adv(tokenizer, adv_if, data):
    """The ``compute_adv`` node: its outputs are added to ``data``; returns (outputs, stats)."""
    out, stats = adv_if.inference(null_model(tokenizer), data)
    data.update_(out)
    return out, stats


def rollout(tokenizer, actor_if, actor, rewards=None, critic=None, critic_if=None):
    """actor_gen -> rew (given) -> ref_inf (the actor itself) -> critic_inf, as the graph runs them."""
    torch.manual_seed(0)
    data = prompt_batch(tokenizer, PROMPTS)
    out = actor_if.generate(actor, data)
    out.update_(actor_if.inference(actor, out))
    n_seqs = len(out.flat_seqlens("packed_input_ids"))
    r = torch.tensor(rewards if rewards is not None else [1.0, -1.0] * (n_seqs // 2), dtype=torch.float32)
    out.update_(per_sequence_sample(out, "rewards", r))
    if critic is not None:
        out.update_(critic_if.inference(critic, out))
    return out


def test_generate_outputs_the_rollout_keys_with_consistent_logprobs(tokenizer):
    actor = make_model(tokenizer)
    a = actor_iface(gen={**GEN, "temperature": 0.7})
    data = prompt_batch(tokenizer, PROMPTS)
    torch.manual_seed(0)
    out = a.generate(actor, data)
    assert out.keys == {"packed_input_ids", "packed_logprobs", "prompt_mask", "seq_no_eos_mask"}
    lens = out.flat_seqlens("packed_input_ids")
    assert out.flat_seqlens("packed_logprobs") == [n - 1 for n in lens]
    assert out.data["prompt_mask"].sum() == sum(len(p.split()) for p in PROMPTS)
    # "The N Implementation Details of RLHF with PPO", policy detail 1: training recomputes log-probs
    # at the sampling temperature, so the first minibatch's importance ratio is exactly 1 (a ratio
    # != 1 there is a frequent complaint in the issue trackers of RLHF libraries)
    ref = a.inference(actor, out).data["packed_ref_logprobs"]
    mask = F.response_loss_mask(out.data["prompt_mask"], out.cu_seqlens("packed_input_ids"))
    torch.testing.assert_close(ref[mask], out.data["packed_logprobs"][mask], atol=1e-4, rtol=0)
    assert (out.data["packed_logprobs"][~mask] == 0).all()
    assert (ref[~mask] == 0).all()  # the reference reads the answer only, like generation


def test_one_ppo_step_raises_logprobs_of_positively_advantaged_tokens(tokenizer):
    actor, critic = make_model(tokenizer, lr=3e-3), make_model(tokenizer, role="critic", critic=True)
    opts = dict(ppo_n_minibatches=1, early_stop_imp_ratio=None, value_norm=False)
    a, c = actor_iface(**opts), critic_iface(**opts)
    data = rollout(tokenizer, a, actor, critic=critic, critic_if=c)
    prepared, _ = compute_adv(tokenizer, adv_iface(**opts), data)
    adv, mask = prepared.data["advantages"], prepared.data["ppo_loss_mask"]
    before = a.inference(actor, data).data["packed_ref_logprobs"]
    stats = a.train_step(actor, data)
    after = a.inference(actor, data).data["packed_ref_logprobs"]
    delta = after - before
    pos, neg = mask & (adv > 0), mask & (adv < 0)
    assert pos.any() and neg.any()
    assert float(delta[pos].mean()) > 0 > float(delta[neg].mean())
    assert stats["importance_ratio"] == pytest.approx(1.0, abs=1e-4)  # one update on fresh samples
    assert actor.version.global_step == 1


def test_critic_moves_values_towards_returns(tokenizer):
    actor, critic = make_model(tokenizer), make_model(tokenizer, role="critic", critic=True, lr=1e-2)
    opts = dict(ppo_n_minibatches=2, value_norm=False, value_eps_clip=None)
    a, c = actor_iface(**opts), critic_iface(**opts)
    data = rollout(tokenizer, a, actor, critic=critic, critic_if=c)
    prepared, _ = compute_adv(tokenizer, adv_iface(**opts), data)
    cu = data.cu_seqlens("packed_input_ids")
    mask, returns = prepared.data["ppo_loss_mask"], prepared.data["returns"]

    def error():
        v = c.inference(critic, data).data["values"][shifted_token_mask(cu)]
        return float((v - returns)[mask].pow(2).mean())

    start = error()
    for _ in range(5):
        stats = c.train_step(critic, data)
    assert error() < 0.5 * start
    assert stats["critic_loss"] > 0 and critic.version.global_step == 5


def _raw_returns(tokenizer, data, values):
    """What the estimator sees with ``values`` in return units: the same batch through a
    ``compute_adv`` without value normalisation (its returns are in return units too)."""
    keys = [k for k in data.keys if k not in ("values",)]
    raw_in = data.select(keys)
    raw_in.update_(token_sample(raw_in, "values", values))
    out, _ = adv_iface(value_norm=False).inference(null_model(tokenizer), raw_in)
    return out


def test_value_norm_moments_live_once_in_compute_adv(tokenizer):
    actor, critic = make_model(tokenizer), make_model(tokenizer, role="critic", critic=True)
    a, c, adv = actor_iface(value_norm=True), critic_iface(value_norm=True), adv_iface(value_norm=True)
    # one state, the advantage computation's: the train steps keep none and save none
    for iface in (a, c):
        assert not stateful(iface)
        assert not any(hasattr(iface, k) for k in ("state", "kl_ctl", "rms"))
    assert stateful(adv)
    data = rollout(tokenizer, a, actor, critic=critic, critic_if=c)
    values = data.data["values"]
    torch.testing.assert_close(values, critic.module.forward(data))  # raw head outputs
    raw = _raw_returns(tokenizer, data, values)  # first step: identity moments
    prepared, _ = compute_adv(tokenizer, adv, data)
    mask, returns = raw.data["ppo_loss_mask"], raw.data["returns"]
    beta = adv.hp.value_norm_beta
    assert adv.rms.mean_std()[0] == pytest.approx(
        float(returns[mask].mean()), rel=1e-4
    )  # debiased EMA of one batch
    assert adv.rms.mean == pytest.approx((1 - beta) * float(returns[mask].mean()), rel=1e-4)
    # the critic's targets and old values come out in its head's units, with the new moments
    torch.testing.assert_close(prepared.data["returns"], adv.rms.normalize(returns))
    torch.testing.assert_close(prepared.data["old_values"], adv.rms.normalize(values))
    torch.testing.assert_close(prepared.data["advantages"], raw.data["advantages"])
    a.train_step(actor, data)
    c.train_step(critic, data)
    # the next batch's values are de-normalised with these moments before GAE, then the moments
    # absorb its returns and normalise its targets
    moments = adv.state_dict()
    mean, std = adv.rms.mean_std()
    raw2 = _raw_returns(tokenizer, data, values * std + mean)
    prepared2, _ = adv.inference(null_model(tokenizer), data)
    expected = F.RunningMeanStd(**moments["value_norm"])
    expected.update(raw2.data["returns"], mask)
    assert adv.state_dict()["value_norm"] == pytest.approx(dataclasses.asdict(expected), rel=1e-5)
    mean2, std2 = expected.mean_std()
    assert (mean2, std2) != pytest.approx((mean, std))
    torch.testing.assert_close(prepared2.data["advantages"], raw2.data["advantages"])
    torch.testing.assert_close(prepared2.data["returns"], (raw2.data["returns"] - mean2) / std2)
    torch.testing.assert_close(prepared2.data["old_values"], (values * std + mean - mean2) / std2)
    restored = adv_iface(value_norm=True)
    restored.load_state_dict(adv.state_dict())
    assert restored.state_dict() == adv.state_dict()


def test_adaptive_kl_controller_updates_in_compute_adv(tokenizer):
    actor, ref = make_model(tokenizer), make_model(tokenizer, role="ref", seed=1, train=False)
    critic = make_model(tokenizer, role="critic", critic=True)
    opts = dict(adaptive_kl_ctl=True, kl_ctl=0.2, adaptive_kl_target=0.5, adaptive_kl_horizon=100)
    a, c, adv = actor_iface(**opts), critic_iface(**opts), adv_iface(**opts)
    data = rollout(tokenizer, a, actor, critic=critic, critic_if=c)
    data.update_(a.inference(ref, data))  # a different reference: KL != 0
    kl, n = rollout_kl(data)
    err = max(min(kl / 0.5 - 1, 0.2), -0.2)
    token_kl = data.data["packed_logprobs"] - data.data["packed_ref_logprobs"]  # k1
    prepared, stats = compute_adv(tokenizer, adv, data)
    mask = prepared.data["ppo_loss_mask"]
    # this batch is penalised with the coefficient from before it; then the controller moves
    torch.testing.assert_close(prepared.data["kl_rewards"], -0.2 * token_kl * mask)
    assert stats["ref_kl"] == pytest.approx(kl)
    assert stats["kl_coef_next"] == pytest.approx(0.2 * (1 + err * n / 100))
    assert adv.kl_ctl.value == pytest.approx(stats["kl_coef_next"])
    a.train_step(actor, data)
    c.train_step(critic, data)
    assert not hasattr(a, "kl_ctl") and not hasattr(c, "kl_ctl")  # one controller
    assert adv.kl_ctl.value == pytest.approx(stats["kl_coef_next"])  # the train steps leave it
    out2, _ = adv.inference(null_model(tokenizer), data)
    torch.testing.assert_close(out2.data["kl_rewards"], -stats["kl_coef_next"] * token_kl * mask)


def test_truncation_and_score_shaping():
    # prompts of 2 tokens; token 4 is the truncation token; after=2
    seqs = [[1, 2, 5, 4, 6, 4, 7], [1, 2, 4, 6, 7, 8, 9]]
    gen = GenerationOutput(
        sequences=torch.tensor(sum(seqs, [])),
        seqlens=[7, 7],
        prompt_lens=[2, 2],
        logprobs=torch.arange(12, dtype=torch.float32),
        no_eos=torch.tensor([True, True]),
    )
    t = truncate_generation(gen, token_id=4, after=2)
    assert t.seqlens == [6, 7]  # first '4' at response index >= 2 is index 3: cut after it
    assert t.sequences[:6].tolist() == [1, 2, 5, 4, 6, 4]
    assert t.logprobs[:5].tolist() == [0, 1, 2, 3, 4] and t.logprobs.shape[0] == 11
    assert t.no_eos.tolist() == [False, True]

    from realrl.impl.interface.common import per_sequence_sample

    prompts = SequenceSample.from_default(
        ids=[0, 1], seqlens=[2, 2], data={"packed_prompts": torch.tensor([1, 2, 1, 2])}
    )
    data = rollout_sample(prompts, t)
    data.update_(per_sequence_sample(data, "rewards", torch.tensor([3.0, 30.0])))
    hp = make_ppo_hyperparameters(
        {"truncate_token": 4, "truncate_after": 2, "truncate_penalty": -1.0, "max_reward_clip": 20.0}
    )
    score, stats = shape_scores(hp, data, 4)
    assert score.tolist() == [3.0, -1.0] and stats["truncation_penalized_frac"] == 0.5
    hp = make_ppo_hyperparameters({"missing_eos_penalty": 2.0, "reward_output_scaling": 0.5})
    assert shape_scores(hp, data, None)[0].tolist() == [1.5, 13.0]
    hp = make_ppo_hyperparameters({"max_reward_clip": 10.0, "mask_no_eos_with_zero": True})
    assert shape_scores(hp, data, None)[0].tolist() == [3.0, 0.0]


def test_lm_human_preferences_preset_samples_fixed_length_and_truncates(tokenizer):
    hp = make_ppo_hyperparameters(preset="lm_human_preferences")
    assert (hp.gen.max_new_tokens, hp.gen.min_new_tokens, hp.gen.fixed_length) == (24, 24, True)
    assert (hp.gen.temperature, hp.kl_ctl, hp.adaptive_kl_ctl, hp.gae_lambda) == (0.7, 0.15, True, 0.95)
    assert (hp.reward_whiten, hp.whiten_scope, hp.ppo_n_epochs, hp.truncate_after) == (
        True,
        "minibatch",
        4,
        16,
    )
    actor = make_model(tokenizer)
    a = make_interface(ModelInterfaceAbstraction("ppo_actor", {"preset": "lm_human_preferences"}))
    torch.manual_seed(0)
    out = a.generate(actor, prompt_batch(tokenizer, PROMPTS))
    dot = tokenizer.convert_tokens_to_ids(".")
    ids, pm = out.data["packed_input_ids"].tolist(), out.data["prompt_mask"].tolist()
    off = 0
    for n in out.flat_seqlens("packed_input_ids"):
        resp = [t for t, m in zip(ids[off : off + n], pm[off : off + n]) if not m]
        off += n
        assert len(resp) == 24 or (resp[-1] == dot and len(resp) - 1 >= 16 and dot not in resp[16:-1])


def test_lm_human_preferences_preset_trains_actor_and_critic(tokenizer):
    actor, critic = make_model(tokenizer), make_model(tokenizer, role="critic", critic=True)
    a = make_interface(
        ModelInterfaceAbstraction("ppo_actor", {"preset": "lm_human_preferences", "ppo": {"gen": GEN}})
    )
    c = make_interface(
        ModelInterfaceAbstraction("ppo_critic", {"preset": "lm_human_preferences", "ppo": {"gen": GEN}})
    )
    adv = make_interface(
        ModelInterfaceAbstraction("ppo_advantages", {"preset": "lm_human_preferences", "ppo": {"gen": GEN}})
    )
    data = rollout(tokenizer, a, actor, critic=critic, critic_if=c)
    _, adv_stats = compute_adv(tokenizer, adv, data)
    assert "truncation_penalized_frac" in adv_stats
    stats = a.train_step(actor, data)
    assert stats["n_updates"] == 4  # 4 epochs of 1 minibatch
    assert c.train_step(critic, data)["critic_loss"] > 0


def test_minibatches_are_reshuffled_each_epoch(tokenizer):
    data = prompt_batch(tokenizer, PROMPTS * 2)
    g = torch.Generator().manual_seed(0)
    samples = data.unpack()
    epochs = [[mb.ids for mb in shuffled_minibatches(samples, 3, g)] for _ in range(4)]
    for e in epochs:
        assert sorted(i for mb in e for i in mb) == list(range(8)) and len(e) == 3
    assert len({tuple(tuple(mb) for mb in e) for e in epochs}) > 1


def test_grpo_groups_k_answers_and_trains_without_a_critic(tokenizer):
    actor = make_model(tokenizer)
    g = make_interface(ModelInterfaceAbstraction("grpo_actor", {"ppo": {"gen": {**GEN, "n": 4}}}))
    assert g.hp.adv_estimator == "grpo" and g.hp.kl_loss_coef > 0
    torch.manual_seed(0)
    data = prompt_batch(tokenizer, PROMPTS[:2])
    out = g.generate(actor, data)
    assert [len(r) for r in out.seqlens["packed_input_ids"]] == [4, 4]
    out.update_(g.inference(actor, out))
    rewards = make_interface(ModelInterfaceAbstraction("reward_fn", {"fn": "word_sentiment"})).inference(
        actor, out
    )
    rewards.data["rewards"] += torch.arange(8, dtype=torch.float32)  # distinct scores in each group
    out.update_(rewards)
    prepared, _ = compute_adv(tokenizer, adv_iface(preset="grpo", gen={**GEN, "n": 4}), out)
    assert "returns" not in prepared.keys and "old_values" not in prepared.keys  # no critic
    adv, mask = prepared.data["advantages"], prepared.data["ppo_loss_mask"]
    lens = [n - 1 for n in out.flat_seqlens("packed_input_ids")]
    per_seq = torch.stack([a[m].mean() for a, m in zip(adv.split(lens), mask.split(lens))])
    expected = F.group_normalized_advantages(out.data["rewards"], [4, 4])
    torch.testing.assert_close(per_seq, expected)
    stats = g.train_step(actor, out)
    assert "kl_loss" in stats and actor.version.global_step == 1
    with pytest.raises(ValueError, match="needs no critic"):
        critic_iface(adv_estimator="grpo", kl_ctl=0.0)
    with pytest.raises(ValueError, match="kl_ctl=0"):
        actor_iface(adv_estimator="grpo")


def test_ppo_options_are_validated():
    with pytest.raises(ValueError, match="unknown PPO option"):
        make_ppo_hyperparameters({"eps_clipp": 0.1})
    with pytest.raises(ValueError, match="unknown PPO preset"):
        make_ppo_hyperparameters(preset="trl")
    with pytest.raises(ValueError, match="whiten_scope"):
        make_ppo_hyperparameters({"whiten_scope": "epoch"})


def test_generation_interface_writes_jsonl(tokenizer, tmp_path):
    actor = make_model(tokenizer, train=False)
    path = tmp_path / "gen" / "out.jsonl"
    gi = make_interface(
        ModelInterfaceAbstraction("generation", {"gconfig": {**GEN, "n": 2}, "output_file": str(path)})
    )
    torch.manual_seed(0)
    out = gi.generate(actor, prompt_batch(tokenizer, PROMPTS[:2]))
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == 4 == len(out.flat_seqlens("packed_input_ids"))
    assert [r["id"] for r in rows] == ["0#0", "0#1", "1#0", "1#1"]
    assert rows[0]["prompt"] == "w1 w2"


def test_logprobs_without_temperature_scaling_are_recomputed_at_temperature_one(tokenizer):
    actor = make_model(tokenizer)
    a = actor_iface(gen={**GEN, "temperature": 0.7}, temperature_scale_logprobs=False)
    torch.manual_seed(0)
    out = a.generate(actor, prompt_batch(tokenizer, PROMPTS))
    mask = F.response_loss_mask(out.data["prompt_mask"], out.cu_seqlens("packed_input_ids"))
    t1 = make_interface("ppo_actor").inference(actor, out).data["packed_ref_logprobs"]  # temperature 1
    torch.testing.assert_close(out.data["packed_logprobs"][mask], t1[mask], atol=1e-4, rtol=0)
    assert (out.data["packed_logprobs"][~mask] == 0).all()


@pytest.mark.parametrize("stop", [{"early_stop_imp_ratio": 0.5}, {"early_stop_kl": -1.0}])
def test_early_stop_zeroes_the_update(tokenizer, stop):
    actor, critic = make_model(tokenizer), make_model(tokenizer, role="critic", critic=True)
    a = actor_iface(**{"ppo_n_minibatches": 1, "early_stop_imp_ratio": None, **stop})
    data = rollout(tokenizer, a, actor, critic=critic, critic_if=critic_iface())
    compute_adv(tokenizer, adv_iface(), data)
    before = [p.detach().clone() for p in actor.module.module.parameters()]
    stats = a.train_step(actor, data)
    assert stats["early_stopped"] == 1.0
    assert all(torch.equal(b, p) for b, p in zip(before, actor.module.module.parameters()))


def test_one_minibatch_whitening_scopes_agree(tokenizer):
    """The optimisation note of PPO detail 9 in "The N Implementation Details of RLHF with PPO": with
    one minibatch, whitening per minibatch and once per batch give the same update."""
    params = []
    for scope in ("batch", "minibatch"):
        actor, critic = make_model(tokenizer), make_model(tokenizer, role="critic", critic=True)
        opts = dict(ppo_n_minibatches=1, ppo_n_epochs=2, reward_whiten=True, whiten_scope=scope)
        a = actor_iface(**opts)
        data = rollout(tokenizer, a, actor, critic=critic, critic_if=critic_iface(**opts))
        compute_adv(tokenizer, adv_iface(**opts), data)
        a.train_step(actor, data)
        params.append([p.detach().clone() for p in actor.module.module.parameters()])
    for p, q in zip(*params):
        torch.testing.assert_close(p, q)


def as_worker(call, model, data):
    """What a model worker does around a call: the inputs on the model's device, the outputs (a
    sample) back in host memory, where the worker's store keeps them."""
    out = call(model, data.to(model.device))
    data.to("cpu")
    return out.to("cpu") if isinstance(out, SequenceSample) else out


@pytest.mark.parametrize(
    "dev", [pytest.param("cuda", marks=pytest.mark.gpu), "cpu:0"], ids=["cuda", "device_discipline"]
)
def test_every_interface_runs_with_models_on_the_device(tokenizer, dev):
    """Models on the GPU, the samples in host memory between calls, as a model worker keeps them:
    every interface runs on its inputs moved to its model's device (the advantage call's model,
    with no weights, is on the CPU). On a CPU the device-discipline check (``cpu:0`` standing in
    for the GPU) raises where CUDA would refuse a host tensor meeting a device one."""
    from device_discipline import DeviceDiscipline

    with DeviceDiscipline() if dev == "cpu:0" else contextlib.nullcontext():
        run_every_interface(tokenizer, dev)


def run_every_interface(tokenizer, dev: str) -> None:
    from interface_fixtures import paired_batch, prompt_answer_batch

    actor, critic = (
        make_model(tokenizer, device=dev),
        make_model(tokenizer, role="critic", critic=True, device=dev),
    )
    a, c = actor_iface(), critic_iface()
    torch.manual_seed(0)
    data = as_worker(a.generate, actor, prompt_batch(tokenizer, PROMPTS))
    data.update_(as_worker(a.inference, actor, data))
    n_seqs = len(data.flat_seqlens("packed_input_ids"))
    data.update_(per_sequence_sample(data, "rewards", torch.tensor([1.0, -1.0] * (n_seqs // 2))))
    data.update_(as_worker(c.inference, critic, data))
    data.update_(as_worker(adv_iface().inference, null_model(tokenizer), data)[0])
    assert all(v.device.type == "cpu" for v in data.data.values() if v is not None)
    assert "loss" in as_worker(a.train_step, actor, data)
    assert "critic_loss" in as_worker(c.train_step, critic, data)
    sft = make_interface("sft")
    assert as_worker(sft.train_step, actor, prompt_answer_batch(tokenizer, [("w1", "good .")]))["loss"] > 0
    pairs = paired_batch(tokenizer, [[("w1 good .", "w1 bad .")]])
    rw = make_interface("paired_rw")
    assert as_worker(rw.train_step, critic, pairs)["loss"] > 0
    dpo = make_interface("dpo")
    pairs.update_(as_worker(dpo.inference, actor, pairs))
    assert as_worker(dpo.train_step, actor, pairs)["loss"] > 0


def test_a_rollout_in_pieces_continues_under_new_weights_and_stamps_the_oldest_version(tokenizer):
    """Partial rollouts: the same rollout keys as ``generate`` when nothing changes; after a
    training step between two pieces, the answers carry the version of their oldest token and
    the call reports them as spanning two versions."""
    a = actor_iface(gen={**GEN, "min_new_tokens": 4}, decoupled_loss=True)
    actor = make_model(tokenizer)
    data = prompt_batch(tokenizer, PROMPTS)
    torch.manual_seed(0)
    whole = a.generate(actor, data)
    torch.manual_seed(0)
    rollout_ = a.start_rollout(actor, data)
    while rollout_.advance(2, actor.version.global_step):
        pass
    same, stats = rollout_.finish()
    for key in whole.keys:
        torch.testing.assert_close(same.data[key], whole.data[key], rtol=0, atol=1e-6)
    assert stats["answers_spanning_versions"] == 0.0 and stats["weight_updates_mid_call"] == 0.0

    torch.manual_seed(0)
    rollout_ = a.start_rollout(actor, data)
    assert rollout_.advance(2, actor.version.global_step) > 0  # min_new_tokens=4: none finished
    trained = rollout(tokenizer, a, make_model(tokenizer, seed=1))
    trained.update_(compute_adv(tokenizer, adv_iface(adv_estimator="reinforce_pp"), trained)[0])
    a.train_step(actor, trained)  # the weights change under the paused rollout: version 1
    while rollout_.advance(2, actor.version.global_step):
        pass
    out, stats = rollout_.finish()
    assert out.data["behav_version"].tolist() == [0] * len(PROMPTS)  # the oldest token's version
    assert stats["answers_spanning_versions"] == 1.0 and stats["weight_updates_mid_call"] == 1.0
    assert not torch.equal(out.data["packed_input_ids"], whole.data["packed_input_ids"])


def test_with_one_update_the_proximal_policy_is_the_updates_own_forward(tokenizer):
    """The decoupled objective with stale answers and one update per step takes the proximal
    log-probs from the update's own forward (no extra pass). It must update the policy exactly as
    the objective says: the same step as the standard loss on pi_prox-anchored ratios with each
    token's advantage scaled by w = pi_prox / pi_behav (pi_prox computed here by a separate forward)."""
    from realrl.api.core.data_api import MicroBatchSpec
    from realrl.impl.interface.ppo_keys import BEHAV_VERSION

    one = dict(
        ppo_n_minibatches=1,
        ppo_n_epochs=1,
        early_stop_imp_ratio=None,
        kl_loss_coef=0.0,
        adv_estimator="reinforce_pp",  # needs no critic
    )
    decoupled, standard = actor_iface(decoupled_loss=True, **one), actor_iface(decoupled_loss=False, **one)
    data = rollout(tokenizer, standard, make_model(tokenizer, seed=2))  # drawn by another policy
    data.update_(compute_adv(tokenizer, adv_iface(**one), data)[0])
    n = len(data.flat_seqlens("packed_input_ids"))
    data.update_(per_sequence_sample(data, BEHAV_VERSION, torch.zeros(n, dtype=torch.long)))
    a, b = make_model(tokenizer, seed=0), make_model(tokenizer, seed=0)
    a.inc_version(), b.inc_version()  # version 1: every answer (version 0) is stale

    prox = standard._logprobs(b, data, MicroBatchSpec())  # pi_prox: the weights before the step
    mask = data.data["ppo_loss_mask"].bool()
    w = torch.where(mask, (prox - data.data["packed_logprobs"]).exp(), torch.zeros_like(prox))
    anchored = dataclasses.replace(data)
    anchored.data = {**data.data, "packed_logprobs": prox, "advantages": data.data["advantages"] * w}

    stats = decoupled.train_step(a, data)
    standard.train_step(b, anchored)
    assert stats["stale_answers"] == float(n) and stats["behav_imp_weight"] != pytest.approx(1.0)
    for (name, pa), (_, pb) in zip(a.module.module.named_parameters(), b.module.module.named_parameters()):
        torch.testing.assert_close(pa, pb, rtol=0, atol=2e-6, msg=name)
