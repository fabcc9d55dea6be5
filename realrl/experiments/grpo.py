"""GRPO: PPO's graph without a critic; K answers per prompt, group-normalised advantages, and a
rule-based or plugin reward (the toy task's default is its hidden sentiment rule)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from realrl.api.quickstart.entrypoint import register_quickstart_exp
from realrl.experiments.ppo import PPOConfig
from realrl.impl.interface.ppo_config import PPOHyperparameters, make_ppo_hyperparameters


def grpo_hyperparameters() -> PPOHyperparameters:
    return make_ppo_hyperparameters(preset="grpo")


@dataclasses.dataclass
class GRPOConfig(PPOConfig):
    ppo: PPOHyperparameters = dataclasses.field(default_factory=grpo_hyperparameters)
    reward_fn: str | None = "toy_sentiment"

    TOY_PRESET: ClassVar[list[str]] = [
        "exp_ctrl.total_train_steps=30",
        "dataset.train_bs_n_seqs=64",
        "dataset.max_prompt_len=16",
        "actor.optimizer.lr=1e-4",
        "ppo.gen.n=4",
        "ppo.gen.max_new_tokens=13",
        "ppo.gen.top_p=1.0",
        "ppo.gen.top_k=0",
        "ppo.ppo_n_epochs=4",
        "ppo.ppo_n_minibatches=4",
    ]

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.ppo.adv_estimator != "grpo":
            raise ValueError("grpo needs ppo.adv_estimator=grpo (use the ppo experiment for GAE)")
        if self.reward_fn is None:
            raise ValueError("grpo needs reward_fn=<registered name | module:function>")

    def initial_setup(self):
        self.experiment_name = self.experiment_name or "grpo"
        return super().initial_setup()

    def _actor_interface(self) -> str:
        return "grpo_actor"


register_quickstart_exp("grpo", GRPOConfig)
