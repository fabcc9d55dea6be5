"""RLOO ("Back to Basics: Revisiting REINFORCE Style Optimization for Learning from Human Feedback in
LLMs", Ahmadian et al. 2024): GRPO's graph, each answer's baseline the mean score of the other
answers to its prompt, the KL penalty in the reward."""

from __future__ import annotations

import dataclasses

from realrl.api.quickstart.entrypoint import register_quickstart_exp
from realrl.experiments.grpo import GRPOConfig
from realrl.impl.interface.ppo_config import PPOHyperparameters, make_ppo_hyperparameters


def rloo_hyperparameters() -> PPOHyperparameters:
    return make_ppo_hyperparameters(preset="rloo")


@dataclasses.dataclass
class RLOOConfig(GRPOConfig):
    ppo: PPOHyperparameters = dataclasses.field(default_factory=rloo_hyperparameters)

    def initial_setup(self):
        self.experiment_name = self.experiment_name or "rloo"
        return super().initial_setup()

    def _actor_interface(self) -> str:
        return "ppo_actor"


register_quickstart_exp("rloo", RLOOConfig)
