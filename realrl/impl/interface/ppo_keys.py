"""The key lists of the PPO-family graphs, defined once: which keys each call reads and writes.

The experiments build their graphs from these (in the master, which imports no torch) and the
interfaces check their inputs against them (in the workers), so the two cannot drift apart.
"""

from __future__ import annotations

from realrl.impl.interface.ppo_config import PPOHyperparameters

# what generation writes
ROLLOUT_KEYS = ("packed_input_ids", "packed_logprobs", "prompt_mask", "seq_no_eos_mask")
# the scores an answer can have, summed into its reward: the reward call's (a reward model or
# function) and, in multi-turn rollouts, its environment's step rewards, written by generation
SCORE_KEYS = ("rewards", "env_rewards")
# the reference policy's log-probs, where a KL term reads them (``PPOHyperparameters.uses_reference``)
REF_LOGPROBS = "packed_ref_logprobs"
# what the actor's update reads: old log-probs and the advantages (and the reference's, above)
ACTOR_TRAIN_KEYS = ("packed_input_ids", "packed_logprobs", "advantages", "ppo_loss_mask")
# what the critic's update reads: old values and targets in its head's units
CRITIC_TRAIN_KEYS = ("packed_input_ids", "old_values", "returns", "ppo_loss_mask")
# the version of the policy an answer was sampled with (training steps behind it): generation
# writes it and the actor's update reads it when the decoupled objective is on
BEHAV_VERSION = "behav_version"
# router replay (``ppo.router_replay``, a Mixture-of-Experts actor): each token's experts as the
# decoder routed it, written by generation and read by the actor's update (router_replay.py)
ROUTED_EXPERTS = "routed_experts"


def score_keys(reward_call: bool, env: bool) -> tuple[str, ...]:
    """The scores a PPO-family graph has: the reward call's and the environment's, or both."""
    keys = (("rewards",) if reward_call else ()) + (("env_rewards",) if env else ())
    if not keys:
        raise ValueError("a PPO-family graph needs a reward: a reward model, reward_fn=... or env=...")
    return keys


def _replayed(hp: PPOHyperparameters) -> tuple[str, ...]:
    return (ROUTED_EXPERTS,) if hp.router_replay else ()


def rollout_keys(hp: PPOHyperparameters, env: bool = False) -> tuple[str, ...]:
    versions = (BEHAV_VERSION,) if hp.decoupled_loss else ()
    return ROLLOUT_KEYS + versions + (("env_rewards",) if env else ()) + _replayed(hp)


def _reference(hp: PPOHyperparameters) -> tuple[str, ...]:
    return (REF_LOGPROBS,) if hp.uses_reference else ()


def eval_inputs(hp: PPOHyperparameters, scores: tuple[str, ...] = ("rewards",)) -> tuple[str, ...]:
    """What the evaluation of held-out rollouts reads."""
    return ROLLOUT_KEYS + _reference(hp) + tuple(scores)


def actor_train_keys(hp: PPOHyperparameters) -> tuple[str, ...]:
    versions = (BEHAV_VERSION,) if hp.decoupled_loss else ()
    return ACTOR_TRAIN_KEYS[:2] + _reference(hp) + ACTOR_TRAIN_KEYS[2:] + versions + _replayed(hp)


def advantage_outputs(hp: PPOHyperparameters) -> tuple[str, ...]:
    """What ``compute_adv`` writes: the critic's targets and old values only with a critic."""
    base = ("advantages", "ppo_loss_mask", "kl_rewards")
    return base + (("returns", "old_values") if hp.uses_critic else ())


def advantage_inputs(hp: PPOHyperparameters, scores: tuple[str, ...] = ("rewards",)) -> tuple[str, ...]:
    extra = ("values",) if hp.uses_critic else ()
    return eval_inputs(hp, scores) + extra + (("baseline_rewards",) if hp.estimator.needs_baseline else ())
