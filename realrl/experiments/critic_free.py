"""RLOO, REINFORCE++ and ReMax: GRPO's graph (no critic, K answers per prompt) with another
advantage estimator, each its own quickstart experiment with its preset.

- ``rloo`` ("Back to Basics: Revisiting REINFORCE Style Optimization for Learning from Human
  Feedback in LLMs", Ahmadian et al. 2024): each answer's baseline is the mean score of the other
  answers to its prompt; the KL penalty in the reward.
- ``reinforce_pp`` ("REINFORCE++: A Simple and Efficient Approach for Aligning Large Language
  Models", Hu 2025): per-token KL in the reward, returns whitened over the whole batch
  (``ppo.adv_estimator=reinforce_pp_baseline`` subtracts each prompt's mean score first).
- ``remax`` ("ReMax: A Simple, Effective, and Efficient Reinforcement Learning Method for Aligning
  Large Language Models", Li et al. 2023): an answer's baseline is the score of the greedy answer
  to its prompt, so the graph gains a second generate and a second reward call
  (``actor_gen_greedy -> rew_inf_greedy``).
"""

from __future__ import annotations

import dataclasses
import functools

from realrl.api.quickstart.entrypoint import register_quickstart_exp
from realrl.experiments.grpo import GRPOConfig
from realrl.impl.interface.ppo_config import PPOHyperparameters, make_ppo_hyperparameters


def critic_free_experiment(name: str, class_name: str, summary: str) -> type[GRPOConfig]:
    """A GRPO-shaped experiment whose ``ppo`` options start from the preset ``name``; its config
    class is ``class_name`` of this module (the name a saved config refers to it by)."""
    defaults = dataclasses.field(default_factory=functools.partial(make_ppo_hyperparameters, preset=name))
    cls = dataclasses.make_dataclass(
        class_name,
        [("ppo", PPOHyperparameters, defaults)],
        bases=(GRPOConfig,),
        namespace={"SUMMARY": summary, "__module__": __name__},
    )
    return register_quickstart_exp(name, cls)


RLOOConfig = critic_free_experiment(
    "rloo",
    "RLOOConfig",
    "RLOO: GRPO's graph, an answer's baseline the mean score of its prompt's others.",
)
ReinforcePPConfig = critic_free_experiment(
    "reinforce_pp",
    "ReinforcePPConfig",
    "REINFORCE++: GRPO's graph, per-token KL in the reward, returns whitened over the batch.",
)
ReMaxConfig = critic_free_experiment(
    "remax", "ReMaxConfig", "ReMax: GRPO's graph, the greedy answer's score as each prompt's baseline."
)
