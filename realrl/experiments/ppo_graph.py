"""The PPO-family graph ("The N Implementation Details of RLHF with PPO"; call names as in
ReaL, docs/algorithms.md): which calls run on which role with which interface, and the keys that
link them. ``ppo.PPOConfig`` builds its experiment from these; ``apps.graph`` draws them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from realrl.api.core.config import ModelInterfaceAbstraction
from realrl.api.core.data_api import MicroBatchSpec
from realrl.api.core.dfg import MFCDef, ModelInterfaceType
from realrl.experiments.common import mfc
from realrl.impl.interface.ppo_config import PPOHyperparameters
from realrl.impl.interface.ppo_keys import (
    CRITIC_TRAIN_KEYS,
    REF_LOGPROBS,
    actor_train_keys,
    advantage_inputs,
    advantage_outputs,
    rollout_keys,
)

PPO_DATASET_KEYS = ("packed_prompts",)
# ReMax's greedy rollout and its score go under their own names
GREEDY_KEYS = {"packed_input_ids": "greedy_input_ids", "prompt_mask": "greedy_prompt_mask"}


@dataclasses.dataclass
class PPOInterfaces:
    """The interface of each role's calls in a PPO-family graph."""

    actor: ModelInterfaceAbstraction
    reward: ModelInterfaceAbstraction
    advantages: ModelInterfaceAbstraction
    critic: ModelInterfaceAbstraction | None = None  # with a critic (GAE)
    greedy_actor: ModelInterfaceAbstraction | None = None  # ReMax's baseline rollout

    @staticmethod
    def of(
        hp: PPOHyperparameters,
        reward: ModelInterfaceAbstraction | None = None,
        actor: str = "ppo_actor",
        env: dict[str, Any] | None = None,
        scores: tuple[str, ...] = ("rewards",),
    ) -> PPOInterfaces:
        """The registered PPO-family interfaces with options ``hp`` (``actor``: the actor's
        interface name; ``env``: its environment options, for multi-turn rollouts; ``scores``: the
        graph's scores, ``ppo_keys.score_keys``); the reward: a reward model unless given."""
        ppo = {"ppo": hp}
        greedy = dataclasses.replace(hp, gen=dataclasses.replace(hp.gen, greedy=True, n=1))
        return PPOInterfaces(
            actor=ModelInterfaceAbstraction(actor, {**ppo, **(env or {})}),
            reward=reward or ModelInterfaceAbstraction("paired_rw"),
            advantages=ModelInterfaceAbstraction("ppo_advantages", {**ppo, "scores": list(scores)}),
            critic=ModelInterfaceAbstraction("ppo_critic", ppo) if hp.uses_critic else None,
            greedy_actor=ModelInterfaceAbstraction(actor, {"ppo": greedy, **(env or {})}),
        )


def ppo_mfcs(
    n_seqs: int,
    hp: PPOHyperparameters | None = None,
    ifaces: PPOInterfaces | None = None,
    mb_specs: dict[str, MicroBatchSpec] | None = None,
    reward_inputs: tuple[str, ...] = ("packed_input_ids",),
    scores: tuple[str, ...] = ("rewards",),
) -> list[MFCDef]:
    """The PPO-family graph, top to bottom:

        actor_gen -> {rew_inf, ref_inf?, critic_inf?} -> compute_adv -> {actor_train, critic_train?}

    ``ref_inf`` only where a KL term reads the reference (``hp.uses_reference``). With ReMax,
    ``actor_gen_greedy -> rew_inf_greedy`` adds the baseline's greedy answers and their scores;
    without a critic both critic calls go. A reward plugin also reads ``prompt_mask``
    (``reward_inputs``) to split prompt from answer. ``scores`` (``ppo_keys.score_keys``): with
    ``env_rewards`` generation writes each trajectory's environment reward; without ``rewards``
    there is no reward call."""
    hp = hp or PPOHyperparameters()
    ifaces = ifaces or PPOInterfaces.of(hp)
    mb = mb_specs or {}
    gen, inf, train = ModelInterfaceType.GENERATE, ModelInterfaceType.INFERENCE, ModelInterfaceType.TRAIN_STEP
    with_env, reward_call = "env_rewards" in scores, "rewards" in scores
    if hp.estimator.needs_baseline and not reward_call:
        raise ValueError(
            f"ppo.adv_estimator={hp.adv_estimator!r} scores a greedy answer with the reward call, and "
            "this graph has none (env=... alone): add reward_fn=... or choose another estimator"
        )
    nodes = [
        mfc(
            "actor_gen",
            "actor",
            gen,
            ifaces.actor,
            n_seqs,
            ("packed_prompts",),
            rollout_keys(hp, env=with_env),
            mb.get("actor_gen"),
        ),
    ]
    if reward_call:
        nodes.append(
            mfc(
                "rew_inf",
                "reward",
                inf,
                ifaces.reward,
                n_seqs,
                reward_inputs,
                ("rewards",),
                mb.get("rew_inf"),
            )
        )
    if hp.uses_reference:  # a KL term reads the reference policy's log-probs
        nodes.append(
            mfc(
                "ref_inf",
                "ref",
                inf,
                ifaces.actor,
                n_seqs,
                ("packed_input_ids",),
                (REF_LOGPROBS,),
                mb.get("ref_inf"),
            )
        )
    if hp.estimator.needs_baseline:
        greedy_out = tuple(GREEDY_KEYS[k] for k in reward_inputs)
        nodes += [
            dataclasses.replace(
                mfc(
                    "actor_gen_greedy",
                    "actor",
                    gen,
                    ifaces.greedy_actor,
                    n_seqs,
                    ("packed_prompts",),
                    greedy_out,
                ),
                output_key_remap=dict(GREEDY_KEYS),
            ),
            dataclasses.replace(
                mfc(
                    "rew_inf_greedy", "reward", inf, ifaces.reward, n_seqs, greedy_out, ("baseline_rewards",)
                ),
                input_key_remap={v: k for k, v in GREEDY_KEYS.items() if v in greedy_out},
                output_key_remap={"rewards": "baseline_rewards"},
            ),
        ]
    if hp.uses_critic:
        nodes.append(
            mfc(
                "critic_inf",
                "critic",
                inf,
                ifaces.critic,
                n_seqs,
                ("packed_input_ids", "seq_no_eos_mask"),
                ("values",),
                mb.get("critic_inf"),
            )
        )
    nodes.append(
        dataclasses.replace(
            mfc(
                "compute_adv",
                "adv",
                inf,
                ifaces.advantages,
                n_seqs,
                advantage_inputs(hp, scores),
                advantage_outputs(hp),
            ),
            whole_batch=True,
        )
    )
    nodes.append(
        mfc(
            "actor_train",
            "actor",
            train,
            ifaces.actor,
            n_seqs,
            actor_train_keys(hp),
            (),
            mb.get("actor_train"),
            log=True,
        )
    )
    if hp.uses_critic:
        nodes.append(
            mfc(
                "critic_train",
                "critic",
                train,
                ifaces.critic,
                n_seqs,
                CRITIC_TRAIN_KEYS,
                (),
                mb.get("critic_train"),
                log=True,
            )
        )
    return nodes
