"""The PPO actor with router replay (``ppo.router_replay``) on a tiny Mixture-of-Experts ReaLModel
in-process: generation writes ``routed_experts``, the recomputed log-probs and every update of the
train step replay them, the reference routes by itself, and the options that cannot replay
(a dense actor, multi-turn rollouts, pipeline stages) are refused."""

from __future__ import annotations

import dataclasses
from unittest import mock

import pytest
import torch
from interface_fixtures import prompt_batch, tiny_config

from realrl.api.core.config import ModelInterfaceAbstraction, ModelName
from realrl.api.core.model_api import Model, make_interface
from realrl.impl.interface.common import per_sequence_sample
from realrl.impl.interface.ppo_config import PPOHyperparameters
from realrl.impl.interface.ppo_keys import ROUTED_EXPERTS, actor_train_keys, rollout_keys
from realrl.impl.interface.router_replay import check_replay_options
from realrl.impl.model.backend.config import OptimizerConfig
from realrl.impl.model.backend.train_engine import TrainEngine
from realrl.impl.model.nn.real_model import ReaLModel
from realrl.impl.model.nn.router_replay import ROUTED_KEY

PROMPTS = ["w1 w2", "w3"]
GEN = {"max_new_tokens": 6, "min_new_tokens": 2, "top_p": 1.0, "top_k": 0, "n": 3}
BASE = dict(kl_loss_coef=0.0, early_stop_imp_ratio=None, ppo_n_minibatches=1, ppo_n_epochs=2, gen=GEN)


def iface(name, **ppo):
    return make_interface(ModelInterfaceAbstraction(name, {"ppo": {**BASE, **ppo}, "preset": "grpo"}))


def actor(tokenizer, moe: bool = True) -> Model:
    cfg = tiny_config()
    if moe:
        cfg = dataclasses.replace(
            cfg, n_experts=4, n_experts_per_tok=2, moe_intermediate_dim=16, norm_topk_prob=True
        )
    torch.manual_seed(0)
    return Model(
        ModelName("actor"), TrainEngine(ReaLModel(cfg), OptimizerConfig(lr=1e-2, grad_clip=0.0)), tokenizer
    )


def rollout(tokenizer, model, a):
    """actor_gen -> reference -> rewards -> compute_adv."""
    torch.manual_seed(0)
    data = a.generate(model, prompt_batch(tokenizer, PROMPTS))
    data.update_(a.inference(model, data))
    data.update_(per_sequence_sample(data, "rewards", torch.arange(6, dtype=torch.float32)))
    adv = iface("ppo_advantages")
    data.update_(adv.inference(Model(ModelName("adv"), None, tokenizer), data)[0])
    return data


def test_the_key_travels_only_with_replay():
    off, on = PPOHyperparameters(), PPOHyperparameters(router_replay=True)
    assert ROUTED_EXPERTS == ROUTED_KEY
    assert ROUTED_EXPERTS not in rollout_keys(off) + actor_train_keys(off)
    assert ROUTED_EXPERTS in rollout_keys(on) and ROUTED_EXPERTS in actor_train_keys(on)
    assert on.gen.record_experts and not off.gen.record_experts


def test_the_train_step_replays_the_decoders_experts(tokenizer):
    model = actor(tokenizer)
    a = iface("ppo_actor", router_replay=True, recompute_logprobs=True)
    data = rollout(tokenizer, model, a)
    routed = data.data[ROUTED_EXPERTS]
    assert routed.dtype == torch.int16 and routed.shape == (data.data["packed_input_ids"].shape[0], 1, 2)
    module = model.module.module
    with mock.patch.object(module, "forward", wraps=module.forward) as spy:
        stats = a.train_step(model, data)
    # the recomputation and both updates (two epochs) were handed the recorded experts
    assert spy.call_count == 3
    for call in spy.call_args_list:
        assert call.kwargs.get("routed_experts") is not None
    # decoder and trainer: one model in fp32, the same experts: rounding at most
    assert stats["rollout_corr/log_ratio_abs_max"] < 1e-5


def test_replayed_experts_decide_the_recomputed_logprobs(tokenizer):
    """Other experts than the decoder's (every token's first one moved along) move the trainer's
    log-probs: the forward routes where the batch says, not by itself."""
    model = actor(tokenizer)
    a = iface("ppo_actor", router_replay=True, recompute_logprobs=True)
    data = rollout(tokenizer, model, a)
    moved = data.data[ROUTED_EXPERTS].clone()
    fed = moved[:, 0, 0] >= 0
    first, second = moved[fed, 0, 0], moved[fed, 0, 1]
    shifted = (first + 1) % 4
    shifted = torch.where(shifted == second, (shifted + 1) % 4, shifted)
    moved[fed, 0, 0] = shifted
    logp = a._logprobs(model, data, None)
    data.data[ROUTED_EXPERTS] = moved
    assert (a._logprobs(model, data, None) - logp).abs().max() > 1e-3


def test_the_reference_routes_by_itself(tokenizer):
    model = actor(tokenizer)
    a = iface("ppo_actor", router_replay=True)
    data = rollout(tokenizer, model, a)
    module = model.module.module
    with mock.patch.object(module, "forward", wraps=module.forward) as spy:
        a.inference(model, data)
    assert all(call.kwargs.get("routed_experts") is None for call in spy.call_args_list)


def test_a_dense_actor_or_multi_turn_rollouts_are_refused(tokenizer):
    a = iface("ppo_actor", router_replay=True)
    with pytest.raises(ValueError, match="router_replay.*dense"):
        a.generate(actor(tokenizer, moe=False), prompt_batch(tokenizer, PROMPTS))
    with pytest.raises(ValueError, match="multi-turn"):
        check_replay_options(PPOHyperparameters(router_replay=True), multi_turn=True)
    check_replay_options(PPOHyperparameters(), multi_turn=True)
