"""The critic, reward-model and DPO losses add a Mixture-of-Experts model's router load-balancing
loss (``add_router_aux_loss``), as the SFT and PPO actor losses do: a train step of each on a
tiny MoE model reports the term and its loss is the task's plus ``coef x aux``."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from interface_fixtures import paired_batch, prompt_answer_batch, tiny_config

from realrl.api.core.config import ModelName
from realrl.api.core.data_api import SequenceSample
from realrl.api.core.model_api import Model, make_interface
from realrl.impl.model.backend.config import OptimizerConfig
from realrl.impl.model.backend.train_engine import TrainEngine
from realrl.impl.model.nn.real_model import ReaLModel

COEF = 0.5
PAIRS = [[("w1 good great .", "w1 bad awful ."), ("w2 good .", "w2 bad .")], [("w3 great .", "w3 awful .")]]


def moe_model(tokenizer, critic: bool) -> Model:
    cfg = dataclasses.replace(
        tiny_config(critic),
        n_experts=4,
        n_experts_per_tok=2,
        moe_intermediate_dim=16,
        norm_topk_prob=True,
        router_aux_loss_coef=COEF,
    )
    torch.manual_seed(0)
    engine = TrainEngine(ReaLModel(cfg), OptimizerConfig(lr=1e-3, grad_clip=0.0))
    return Model(ModelName("critic" if critic else "actor"), engine, tokenizer)


def critic_batch(tokenizer) -> SequenceSample:
    """Values, returns and a loss mask over the answers of prompt-answer pairs."""
    batch = prompt_answer_batch(tokenizer, [("w1 w2", "good great ."), ("w3", "w4 w5 .")])
    g = torch.Generator().manual_seed(1)
    samples = []
    for i, sample in enumerate(batch.unpack()):
        tokens, prompt = sample.data["packed_input_ids"], sample.data["prompt_mask"]
        n = len(tokens)
        data = {
            "packed_input_ids": tokens,
            "old_values": torch.randn(n, generator=g),
            "returns": torch.randn(n - 1, generator=g),
            "ppo_loss_mask": ~prompt[1:],
        }
        samples.append(SequenceSample.from_default(ids=[i], seqlens=[n], data=data))
    return SequenceSample.gather(samples)


def train(kind: str, tokenizer) -> dict[str, float]:
    if kind == "ppo_critic":
        return make_interface("ppo_critic").train_step(moe_model(tokenizer, True), critic_batch(tokenizer))
    batch = paired_batch(tokenizer, PAIRS)
    if kind == "paired_rw":
        return make_interface("paired_rw").train_step(moe_model(tokenizer, True), batch)
    dpo, model = make_interface("dpo"), moe_model(tokenizer, False)
    batch.update_(dpo.inference(model, batch))  # the reference: the policy itself, before training
    return dpo.train_step(model, batch)


@pytest.mark.parametrize("kind", ["ppo_critic", "paired_rw", "dpo"])
def test_the_loss_adds_the_router_term(kind, tokenizer):
    stats = train(kind, tokenizer)
    prefix = "critic_" if kind == "ppo_critic" else ""
    moe = {k.removeprefix(prefix): v for k, v in stats.items() if k.removeprefix(prefix).startswith("moe_")}
    assert set(moe) == {"moe_aux_loss", "moe_load_min", "moe_load_max", "moe_task_loss"}, stats
    assert moe["moe_aux_loss"] > 0 and 0 <= moe["moe_load_min"] <= 0.5 <= moe["moe_load_max"] <= 1
    loss = stats[f"{prefix}loss"]
    assert loss == pytest.approx(moe["moe_task_loss"] + COEF * moe["moe_aux_loss"], rel=1e-5)
