"""Registered interfaces, as in ReaL: what an MFC runs on the model it is given.

sft, paired_rw, dpo, ppo_actor, grpo_actor, ppo_critic, ppo_advantages, group_filter, generation, reward_fn; and the reward
function ``word_sentiment``.
"""

from realrl.impl.interface import (  # noqa: F401  (imported to register)
    dpo_interface,
    generation_interface,
    group_filter,
    ppo_actor,
    ppo_advantages,
    ppo_critic,
    reward_plugin,
    rule_reward,
    rw_interface,
    sft_interface,
)
