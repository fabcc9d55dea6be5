"""Call costs on paper for PPO on Llama-2 7B and 70B (config folders only, nothing runs): every
call of the plan space gets one, and they move as the formulas say when dp, tp, the model, the
hardware or the engine change."""

from __future__ import annotations

import dataclasses
import functools
import os

import pytest

from realrl.api.core.layout import Layout
from realrl.api.core.model_size import model_configs, param_counts
from realrl.api.core.system_api import ExperimentConfig
from realrl.apps.plan_search.paper_costs import HARDWARE, Hardware, paper_costs
from realrl.apps.plan_search.simulator import Costs, simulate
from realrl.apps.plan_search.space import call_options, with_allocation

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
H100 = HARDWARE["h100"]
NO_LATENCY = dataclasses.replace(H100, intra_node_latency=0.0, inter_node_latency=0.0)
# 512 prompts, one minibatch: the training is compute-bound (its gradient sync is small beside it)
BIG = ("dataset.train_bs_n_seqs=512", "ppo.ppo_n_minibatches=1")


@functools.cache
def ppo(model: str = "llama-2-7b", extra: tuple[str, ...] = ()) -> ExperimentConfig:
    """The PPO experiment with every role from the model's config folder (the dataset need not exist)."""
    from realrl.apps.configs import build_config, register_everything

    register_everything()
    path = os.path.join(REPO, "examples", "configs", model)
    roles = [f"{r}.path={path}" for r in ("actor", "critic", "ref", "rew")]
    return build_config("ppo", [*roles, "dataset.path=prompts.jsonl", *extra]).initial_setup()


def costs(model: str = "llama-2-7b", extra: tuple[str, ...] = (), n: int = 8, hw: Hardware = H100) -> Costs:
    exp = ppo(model, extra)
    return paper_costs(exp, model_configs(exp), n, hw)


def test_every_call_in_every_layout_of_the_plan_space_has_a_cost():
    exp, c = ppo(), costs()
    expected = {(m.name, str(p.layout)) for m in exp.mfcs for p in call_options(m, 8)}
    assert set(c.calls) == expected
    assert ("actor_gen", "d2m4p1") in c.calls and ("compute_adv", "d1m1p1") in c.calls
    assert all(0 < s < 60 for s in c.calls.values())
    assert c.model_bytes["actor"] == 2 * 6_738_415_616 and "adv" not in c.model_bytes  # bf16 weights
    assert c.bandwidth == H100.intra_node_bandwidth * H100.comm_efficiency  # one node: NVLink


def test_training_is_compute_bound_and_halves_with_data_parallelism():
    c = costs(extra=BIG)
    t1 = c.calls[("actor_train", "d1m1p1")]
    params = param_counts(model_configs(ppo(extra=BIG))["actor"], 1)[0]
    tokens = 512 * (256 + 256)
    matmuls = 6 * (params - 32000 * 4096) * tokens / (H100.peak_flops * H100.train_mfu)  # 6 P T
    assert 1.0 < t1 / matmuls < 1.06  # + causal attention, ~3 % at 512 tokens
    assert 0.49 < c.calls[("actor_train", "d2m1p1")] / t1 < 0.53
    assert 0.125 < c.calls[("actor_train", "d8m1p1")] / t1 < 0.14
    # tensor parallelism splits the same FLOPs but all-reduces activations: dearer than dp per rank
    assert c.calls[("actor_train", "d1m8p1")] > 1.2 * c.calls[("actor_train", "d8m1p1")]
    # four minibatches: four gradient all-reduces instead of one
    four = costs(extra=BIG[:1]).calls
    assert four[("actor_train", "d8m1p1")] > c.calls[("actor_train", "d8m1p1")] + 0.2
    assert four[("actor_train", "d1m1p1")] == pytest.approx(t1)  # no dp: nothing to sync


def test_tensor_parallelism_stays_in_a_node_and_data_parallelism_crosses_at_nic_speed():
    exp, c = ppo(extra=BIG), costs(extra=BIG, n=16)
    assert set(c.calls) == {(m.name, str(p.layout)) for m in exp.mfcs for p in call_options(m, 16, 8)}
    assert max(Layout.parse(layout).tp for _, layout in c.calls) == 8
    assert ("actor_train", "d2m8p1") in c.calls and ("actor_train", "d1m16p1") not in c.calls
    assert c.bandwidth == H100.inter_node_bandwidth * H100.comm_efficiency
    # 16 ranks span two nodes: the gradient all-reduce runs at 50 GB/s, not 450 GB/s
    d8, d16 = c.calls[("actor_train", "d8m1p1")], c.calls[("actor_train", "d16m1p1")]
    grads = 4 * 6_738_415_616
    nvlink, nic = (bw * H100.comm_efficiency for bw in (H100.intra_node_bandwidth, H100.inter_node_bandwidth))
    assert d16 - d8 / 2 == pytest.approx(2 * 15 / 16 * grads / nic - 2 * 7 / 8 * grads / nvlink / 2, rel=0.02)


def test_generation_is_memory_bound_and_tp_halves_its_decode():
    c = costs()
    gen, inf = c.calls[("actor_gen", "d1m1p1")], c.calls[("ref_inf", "d1m1p1")]
    assert gen > 2.5 * inf  # half the tokens of the inference call are new, yet it takes longer
    # dp splits the sequences but every replica reads all the weights every step
    assert c.calls[("actor_gen", "d2m1p1")] / gen > 0.65
    flat = costs(hw=NO_LATENCY).calls
    assert flat[("actor_gen", "d1m1p1")] == pytest.approx(gen)  # tp 1: no collective
    # the decode part: 256 new tokens less 128 (the prefill of the prompts is the same)
    fewer = costs(extra=("ppo.gen.max_new_tokens=128",), hw=NO_LATENCY).calls
    decode = {
        tp: flat[("actor_gen", f"d1m{tp}p1")] - fewer[("actor_gen", f"d1m{tp}p1")] for tp in (1, 2, 4, 8)
    }
    assert decode[1] > 0.4 * gen  # most of the call
    for tp in (1, 2, 4):  # the weights and the KV cache a rank reads halve; activations' all-reduce stays
        assert 0.49 < decode[2 * tp] / decode[tp] < 0.55, tp
    # every decode step (and the prefill) pays 2 all-reduces per layer and the logits' gather
    latency = c.calls[("actor_gen", "d1m2p1")] - flat[("actor_gen", "d1m2p1")]
    assert latency == pytest.approx((256 + 1) * (2 * 32 + 1) * H100.intra_node_latency)


def test_70b_costs_more_than_7b_in_proportion_to_its_parameters():
    small, big = costs().calls, costs("llama-2-70b").calls
    ratio = 68_976_648_192 / 6_738_415_616
    for call in ("actor_train", "critic_train", "ref_inf"):
        for layout in ("d1m1p1", "d8m1p1"):  # FLOPs and gradient bytes: both go with P
            assert 0.97 < big[(call, layout)] / small[(call, layout)] / ratio < 1.05, (call, layout)
        # tp's all-reduces go with n_layers x hidden (5x), not with P (10x)
        assert 0.75 < big[(call, "d1m8p1")] / small[(call, "d1m8p1")] / ratio < 0.9, call
    assert big[("actor_gen", "d1m8p1")] > 4 * small[("actor_gen", "d1m8p1")]  # GQA: a smaller KV cache


def test_engine_options_and_hardware_change_the_costs():
    base = costs(extra=BIG).calls
    ckpt = costs(extra=(*BIG, "actor.engine.gradient_checkpointing=true")).calls
    assert 1.32 < ckpt[("actor_train", "d1m1p1")] / base[("actor_train", "d1m1p1")] < 1.34  # 8 P T vs 6 P T
    fsdp = costs(extra=(*BIG, "actor.engine.fsdp=true")).calls
    assert fsdp[("actor_train", "d8m1p1")] > base[("actor_train", "d8m1p1")] + 0.05  # weights gathered
    assert fsdp[("actor_train", "d1m8p1")] == base[("actor_train", "d1m8p1")]  # dp 1: nothing sharded
    a100 = costs(extra=BIG, hw=HARDWARE["a100"]).calls
    ratio = a100[("actor_train", "d1m1p1")] / base[("actor_train", "d1m1p1")]
    assert ratio == pytest.approx(H100.peak_flops / HARDWARE["a100"].peak_flops, rel=1e-6)


def test_a_role_without_a_model_gets_a_small_cost_and_the_table_is_frozen():
    exp = ppo()
    configs = {**model_configs(exp), "reward": None}
    c = paper_costs(exp, configs, 8, H100)
    assert 0 < c.calls[("compute_adv", "d1m1p1")] < 0.01
    assert c.calls[("rew_inf", "d1m1p1")] == c.calls[("rew_inf", "d8m1p1")] < 0.01
    assert "reward" not in c.model_bytes
    with pytest.raises(TypeError):
        HARDWARE["tpu"] = H100  # type: ignore[index]


def test_simulate_replays_a_plan_on_paper_costs():
    exp, c = ppo(), costs()
    sim = simulate(with_allocation(exp, "d8m1p1"), c)
    # every call shares worker 0 and no model moves: a step is the sum of the calls
    total = sum(c.calls[(m.name, "d1m1p1" if m.whole_batch else "d8m1p1")] for m in exp.mfcs)
    assert sim.step_seconds == pytest.approx(total, rel=1e-3)
    assert sim.realloc_seconds == pytest.approx(0.0, abs=1e-3)
