"""ReMax ("ReMax: A Simple, Effective, and Efficient Reinforcement Learning Method for Aligning Large
Language Models", Li et al. 2023): an answer's baseline is the score of the greedy answer to its
prompt, so the graph has a second generate call and a second reward call
(``actor_gen_greedy -> rew_inf_greedy``)."""

from __future__ import annotations

import dataclasses

from realrl.api.quickstart.entrypoint import register_quickstart_exp
from realrl.experiments.grpo import GRPOConfig
from realrl.impl.interface.ppo_config import PPOHyperparameters, make_ppo_hyperparameters


def remax_hyperparameters() -> PPOHyperparameters:
    return make_ppo_hyperparameters(preset="remax")


@dataclasses.dataclass
class ReMaxConfig(GRPOConfig):
    ppo: PPOHyperparameters = dataclasses.field(default_factory=remax_hyperparameters)

    def initial_setup(self):
        self.experiment_name = self.experiment_name or "remax"
        return super().initial_setup()

    def _actor_interface(self) -> str:
        return "ppo_actor"


register_quickstart_exp("remax", ReMaxConfig)
