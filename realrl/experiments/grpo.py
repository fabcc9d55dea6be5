"""GRPO: PPO's graph without a critic; K answers per prompt, group-normalised advantages, and a
rule-based or plugin reward. ``ppo_preset=dr_grpo | dapo | gspo`` switch to its relatives."""

from __future__ import annotations

import dataclasses

from realrl.api.quickstart.entrypoint import register_quickstart_exp
from realrl.experiments.ppo import PPOConfig
from realrl.impl.interface.ppo_config import PPOHyperparameters, make_ppo_hyperparameters


def grpo_hyperparameters() -> PPOHyperparameters:
    return make_ppo_hyperparameters(preset="grpo")


def critic_free_checks(config: PPOConfig) -> None:
    """What every critic-free experiment (GRPO, RLOO, REINFORCE++, ReMax) needs."""
    name = config.experiment_name or "this experiment"
    if config.ppo.uses_critic:
        raise ValueError(
            f"{name} trains no critic, but ppo.adv_estimator={config.ppo.adv_estimator!r} needs one "
            "(use the ppo experiment)"
        )
    if config.reward_fn is None and not config.takes_turns:
        raise ValueError(
            f"{name} needs a reward: reward_fn=<registered name | module:function>, env=<an environment> "
            "or agent=<file.py:run>"
        )


@dataclasses.dataclass
class GRPOConfig(PPOConfig):
    SUMMARY = "GRPO: PPO without a critic, advantages normalised over each prompt's K answers."

    ppo: PPOHyperparameters = dataclasses.field(default_factory=grpo_hyperparameters)
    reward_fn: str | None = None  # the sentiment task sets toy_sentiment, the arithmetic task math_answer

    def __post_init__(self) -> None:
        super().__post_init__()
        critic_free_checks(self)

    def initial_setup(self):
        self.experiment_name = self.experiment_name or "grpo"
        return super().initial_setup()

    def _actor_interface(self) -> str:
        return "grpo_actor"


register_quickstart_exp("grpo", GRPOConfig)
