"""Interfaces, as in ReaL: what an MFC runs on the model it is given (sft, paired_rw, dpo,
ppo_actor, grpo_actor, ppo_critic, ppo_advantages, group_filter, generation, reward_fn; and the
reward function ``word_sentiment``). ``realrl.impl.builtin`` imports them all to register them."""
