"""REINFORCE++ ("REINFORCE++: A Simple and Efficient Approach for Aligning Large Language Models",
Hu 2025): GRPO's graph, per-token KL in the reward, returns whitened over the whole batch
(``ppo.adv_estimator=reinforce_pp_baseline`` subtracts each prompt's mean score first)."""

from __future__ import annotations

import dataclasses

from realrl.api.quickstart.entrypoint import register_quickstart_exp
from realrl.experiments.grpo import GRPOConfig
from realrl.impl.interface.ppo_config import PPOHyperparameters, make_ppo_hyperparameters


def reinforce_pp_hyperparameters() -> PPOHyperparameters:
    return make_ppo_hyperparameters(preset="reinforce_pp")


@dataclasses.dataclass
class ReinforcePPConfig(GRPOConfig):
    ppo: PPOHyperparameters = dataclasses.field(default_factory=reinforce_pp_hyperparameters)

    def initial_setup(self):
        self.experiment_name = self.experiment_name or "reinforce_pp"
        return super().initial_setup()

    def _actor_interface(self) -> str:
        return "ppo_actor"


register_quickstart_exp("reinforce_pp", ReinforcePPConfig)
