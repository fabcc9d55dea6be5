"""PPO ("The N Implementation Details of RLHF with PPO"; call names as in ReaL, docs/algorithms.md):
the experiment's options and how they make the runtime config.

actor_gen -> {rew_inf, ref_inf, critic_inf} -> {actor_train, critic_train} (``ppo_graph``). The
reward node is the trained reward model, or any registered reward function / interface
(``reward_fn=module:function``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from realrl.api.core.config import ModelAbstraction, ModelBackendAbstraction, ModelInterfaceAbstraction
from realrl.api.core.dfg import MFCDef, ModelInterfaceType
from realrl.api.core.system_api import AsyncRL, DynamicSampling, ExperimentConfig, ModelSpec
from realrl.api.quickstart.base import CommonExperimentConfig, check_choice
from realrl.api.quickstart.entrypoint import register_quickstart_exp
from realrl.experiments.common import (
    ModelTrainEvalConfig,
    experiment_config,
    mfc,
    ref_is_actor_base,
    reference_on_actor,
    task_model_config,
)
from realrl.experiments.datasets import PromptOnlyDatasetConfig
from realrl.experiments.ppo_graph import PPOInterfaces, ppo_mfcs
from realrl.impl.interface.ppo_config import PPOHyperparameters
from realrl.impl.interface.ppo_keys import (
    eval_inputs,
    score_keys,
)
from realrl.impl.interface.router_replay import check_router_replay


@dataclasses.dataclass
class DynamicSamplingConfig:
    """DAPO's dynamic sampling (``ExperimentConfig.dynamic_sampling``): a ``filter_groups`` call
    after the reward drops the prompts whose answers all score the same, and further prompts
    refill the batch, for at most ``max_rounds`` batches of prompts per step."""

    enabled: bool = False
    metric: str = "rewards"  # the per-answer key compared within a group: the reward call's score
    tolerance: float = 0.0  # a group whose scores spread by no more than this counts as uniform
    max_rounds: int = 10  # batches of prompts one step may sample before the run stops

    def mfc(self, n_seqs: int) -> MFCDef:
        """The filter call: on the tokenizer-only ``adv`` role, over each round's whole batch."""
        iface = ModelInterfaceAbstraction(
            "group_filter", {"metric": self.metric, "tolerance": self.tolerance}
        )
        node = mfc("filter_groups", "adv", ModelInterfaceType.INFERENCE, iface, n_seqs, (self.metric,))
        return dataclasses.replace(node, whole_batch=True)


@dataclasses.dataclass
class AsyncRLConfig:
    """Asynchronous RL (``async_rl.*``; docs/async.md): generation runs up to ``max_staleness``
    training steps ahead of training, on the policy versions it has. It gains only where
    generation and training run on different workers (a per-call layout); on the same workers
    they still take turns, and the run is correct but no faster."""

    enabled: bool = False
    max_staleness: int = 1  # AReaL's max_head_offpolicyness; 0 is the synchronous run
    partial_rollout: bool = False  # interruptible generation: newer weights reach answers mid-decoding
    # partial rollouts: tokens decoded between two chances to take newer weights
    interrupt_every: int = 16

    def __post_init__(self) -> None:
        if self.max_staleness < 0:
            raise ValueError(f"async_rl.max_staleness must be >= 0, got {self.max_staleness}")
        if self.interrupt_every < 1:
            raise ValueError(f"async_rl.interrupt_every must be >= 1 token, got {self.interrupt_every}")
        if self.partial_rollout and not self.enabled:
            raise ValueError("async_rl.partial_rollout=true needs async_rl.enabled=true")


@dataclasses.dataclass
class PPOConfig(CommonExperimentConfig):
    SUMMARY = "PPO with a critic, a frozen reference, and a reward model or reward function."

    actor: ModelTrainEvalConfig = dataclasses.field(default_factory=ModelTrainEvalConfig)
    critic: ModelTrainEvalConfig = dataclasses.field(default_factory=ModelTrainEvalConfig)
    ref: ModelTrainEvalConfig = dataclasses.field(default_factory=ModelTrainEvalConfig)
    rew: ModelTrainEvalConfig = dataclasses.field(default_factory=ModelTrainEvalConfig)
    dataset: PromptOnlyDatasetConfig = dataclasses.field(default_factory=PromptOnlyDatasetConfig)
    ppo: PPOHyperparameters = dataclasses.field(default_factory=PPOHyperparameters)
    # a registered reward function, "package.module:function" or "file.py:function"; replaces rew.*
    reward_fn: str | None = None
    reward_fn_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    # scale the reward model's score to mean 0 / std 1 on the first (SFT-policy) batch (RM detail 3)
    normalize_reward_on_first_batch: bool = True
    critic_head_init: str = "reward"  # reward | zeros: the head a critic gets when loaded from an LM
    # held-out prompts an embedded task's summary samples; 0: no held-out evaluation at the end
    toy_eval_prompts: int = 800
    eval_prompts: int = 64  # held-out prompts (dataset.valid_path) of each evaluation during training
    tokenizer_path: str | None = None
    dynamic_sampling: DynamicSamplingConfig = dataclasses.field(default_factory=DynamicSamplingConfig)
    # actor.lora.rank > 0 and ref.path the actor's base: ref_inf runs the actor with its adapters
    # off (the exact reference policy, no second copy of the weights); false loads ref.path apart
    ref_from_actor_base: bool = True
    async_rl: AsyncRLConfig = dataclasses.field(default_factory=AsyncRLConfig)
    # multi-turn rollouts (docs/agents.md): the environment each trajectory takes turns with (a
    # register_env name, "package.module:Class" or "file.py:Class"), its constructor's keyword
    # arguments after the row's metadata, and the seconds one step may take. Its step rewards
    # are the reward, plus a reward model's or reward_fn's score when one is configured too.
    env: str | None = None
    env_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    env_timeout: float = 60.0
    # or your existing agent code: "file.py:run" naming async def run(client, prompt, **metadata)
    # -> reward, where client is an openai.AsyncOpenAI served by the policy (docs/agents.md)
    agent: str | None = None
    agent_timeout: float = 600.0  # seconds one agent's whole run may take

    CURVES = {
        "reward": ["compute_adv/task_reward", "eval/task_reward"],
        "kl": ["compute_adv/ref_kl", "eval/ref_kl"],  # the actor's KL to the reference model
        "loss": ["actor_train/loss", "critic_train/critic_loss"],
        "length": ["compute_adv/response_length", "eval/response_length"],
        # dynamic sampling: the share of prompts kept, and batches of prompts sampled per step
        "sampling": ["dynamic_sampling/kept_fraction", "dynamic_sampling/rounds"],
        # asynchronous RL: how old the trained samples were, and how long each call's workers idled
        "staleness": ["async/staleness_max", "async/staleness_mean"],
        "idle": ["async/idle_s/*"],
    }
    PROGRESS = {
        "reward": ("compute_adv/task_reward",),
        "kl": ("compute_adv/ref_kl",),
        "loss": ("actor_train/loss",),
        "rounds": ("dynamic_sampling/rounds",),
        "stale": ("async/staleness_mean",),
    }

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice("critic_head_init", self.critic_head_init, ("reward", "zeros"))
        if self.exp_ctrl.eval_freq_steps is not None and not self.dataset.valid_path:
            raise ValueError(
                "exp_ctrl.eval_freq_steps evaluates on dataset.valid_path, which is not set (give a file "
                "of held-out prompts)"
            )
        if self.eval_prompts < 1:
            raise ValueError(f"eval_prompts must be >= 1, got {self.eval_prompts}")
        if self.toy_eval_prompts < 0:
            raise ValueError(
                f"toy_eval_prompts must be >= 0 (0: no held-out evaluation), got {self.toy_eval_prompts}"
            )
        sampling = self.dynamic_sampling
        if sampling.enabled and self.ppo.gen.n < 2:
            raise ValueError(
                "dynamic_sampling.enabled=true drops prompts whose answers all score the same, which "
                f"needs several answers per prompt; ppo.gen.n is {self.ppo.gen.n} (set it to 2 or more)"
            )
        if sampling.max_rounds < 1:
            raise ValueError(f"dynamic_sampling.max_rounds must be >= 1, got {sampling.max_rounds}")
        if self.env is None and self.ppo.max_turns > 1:
            raise ValueError(
                f"ppo.max_turns={self.ppo.max_turns} takes turns with an environment, and env is not set "
                "(env=<registered name | module:Class | file.py:Class>)"
            )
        if self.env_timeout <= 0 or self.agent_timeout <= 0:
            raise ValueError(
                f"env_timeout and agent_timeout must be > 0 seconds, got {self.env_timeout}, {self.agent_timeout}"
            )
        if self.env is not None and self.agent is not None:
            raise ValueError("env and agent both produce the trajectories: set one of them")
        if self.agent is not None and self.ppo.max_turns > 1:
            raise ValueError(
                "ppo.max_turns counts an environment's turns; an agent (agent=...) decides its own"
            )
        if self.takes_turns and self.async_rl.partial_rollout:
            raise ValueError(
                "async_rl.partial_rollout cannot interrupt multi-turn rollouts (env is set): a turn waits "
                "on its environment; keep async_rl.enabled and set async_rl.partial_rollout=false"
            )

    def unused_groups(self) -> set[str]:
        """Without a reward model there is no ``rew``, without GAE no ``critic``, and no ``ref``
        when no KL term reads the reference or the LoRA actor's base is the reference."""
        return (
            ({"rew"} if not self.uses_reward_model else set())
            | ({"critic"} if not self.uses_critic else set())
            | ({"ref"} if self.ref_is_actor_base or not self.ppo.uses_reference else set())
        )

    @property
    def ref_is_actor_base(self) -> bool:
        return ref_is_actor_base(self.ref_from_actor_base, self.actor, self.ref)

    def reward_spec(
        self, tokenizer: str | None, path: str | None
    ) -> tuple[ModelSpec, ModelInterfaceAbstraction]:
        """The reward role's model and the interface of ``rew_inf``: a hook subclasses override."""
        if self.reward_fn is not None:
            model = ModelAbstraction("null", {"tokenizer_path": tokenizer} if tokenizer else {})
            iface = ModelInterfaceAbstraction(
                "reward_fn", {"fn": self.reward_fn, "fn_kwargs": dict(self.reward_fn_kwargs)}
            )
            return ModelSpec(model, ModelBackendAbstraction("null")), iface
        rew = dataclasses.replace(self.rew, path=path)
        iface = ModelInterfaceAbstraction(
            "paired_rw", {"normalize_on_first_inference": self.normalize_reward_on_first_batch}
        )
        hint = "; or reward_fn=<registered name | module:function> for a reward function"
        return ModelSpec(
            rew.model(is_critic=True, tokenizer_path=tokenizer, key="rew", hint=hint),
            rew.backend(trainable=False),
        ), iface

    def initial_setup(self) -> ExperimentConfig:
        self.experiment_name = self.experiment_name or "ppo"
        prompts, tokenizer = self.dataset.path, self.tokenizer_path
        actor_path = self.actor.path
        rew_path = self.rew.path if self.uses_reward_model else None
        ref_path = self.ref.path or actor_path
        critic_path = self.critic.path or rew_path or actor_path  # from the RM when there is one
        tokenizer = tokenizer or actor_path
        hp = self.resolved_ppo()
        scores = self.scores
        env = None
        if self.env is not None:
            env = {"env": self.env, "env_kwargs": dict(self.env_kwargs), "env_timeout": self.env_timeout}
        if self.agent is not None:
            env = {"agent": self.agent, "agent_timeout": self.agent_timeout}
        ifaces = PPOInterfaces.of(hp, actor=self._actor_interface(), env=env, scores=scores)
        actor = dataclasses.replace(self.actor, path=actor_path)
        ref = dataclasses.replace(self.ref, path=ref_path)
        critic = dataclasses.replace(self.critic, path=critic_path)
        models = {
            "actor": ModelSpec(
                actor.model(False, tokenizer_path=tokenizer, key="actor"),
                actor.backend(trainable=True, key="actor"),
                keep_gen_copy=actor.keep_gen_copy,
            ),
        }
        if self.ppo.uses_reference and not self.ref_is_actor_base:
            models["ref"] = ModelSpec(
                ref.model(False, tokenizer_path=tokenizer, key="ref"), ref.backend(trainable=False)
            )
        # after the actor's: with no model path at all, the message names actor.path first
        if "rewards" in scores:
            models["reward"], ifaces.reward = self.reward_spec(tokenizer, rew_path)
        # the advantage computation holds no weights: the tokenizer only (a text truncate_token)
        models["adv"] = ModelSpec(
            ModelAbstraction("null", {"tokenizer_path": tokenizer} if tokenizer else {}),
            ModelBackendAbstraction("null"),
        )
        if self.uses_critic:
            models["critic"] = ModelSpec(
                critic.model(
                    True, tokenizer_path=tokenizer, critic_head_init=self.critic_head_init, key="critic"
                ),
                critic.backend(trainable=True, key="critic"),
                keep_gen_copy=critic.keep_gen_copy,
            )
        mb_specs = {
            "actor_gen": self.actor.mb_spec(),
            "actor_train": self.actor.mb_spec(),
            "ref_inf": self.ref.mb_spec(),
            "rew_inf": self.rew.mb_spec(),
            "critic_inf": self.critic.mb_spec(),
            "critic_train": self.critic.mb_spec(),
        }
        reward_inputs = (
            ("packed_input_ids",) if self.uses_reward_model else ("packed_input_ids", "prompt_mask")
        )
        nodes = ppo_mfcs(self.dataset.train_bs_n_seqs, hp, ifaces, mb_specs, reward_inputs, scores)
        if self.ref_is_actor_base:
            nodes = reference_on_actor(nodes)
        extra: dict[str, Any] = {}
        if self.dynamic_sampling.enabled:
            nodes.append(self.dynamic_sampling.mfc(self.dataset.train_bs_n_seqs))
            produced = {k for m in nodes for k in m.output_keys}
            if self.dynamic_sampling.metric == "rewards" and "rewards" not in produced:
                # an environment's reward is the only score: groups are compared on it
                nodes[-1] = DynamicSamplingConfig(
                    metric="env_rewards", tolerance=self.dynamic_sampling.tolerance
                ).mfc(self.dataset.train_bs_n_seqs)
            elif self.dynamic_sampling.metric not in produced:
                raise ValueError(
                    f"dynamic_sampling.metric={self.dynamic_sampling.metric!r} is written by no call of "
                    f"the graph; choose one of {sorted(produced)}"
                )
            extra["dynamic_sampling"] = DynamicSampling("filter_groups", self.dynamic_sampling.max_rounds)
        if self.async_rl.enabled:
            pieces = self.async_rl.interrupt_every if self.async_rl.partial_rollout else None
            extra["async_rl"] = AsyncRL(self.async_rl.max_staleness, pieces)
        evaluation = {}
        if self.dataset.valid_path:  # held-out rollouts every exp_ctrl.eval_freq_steps and at the end
            evaluation = dict(
                eval_prompts=self.dataset.abstraction(self.dataset.valid_path),
                eval_calls=[
                    "actor_gen",
                    *(["rew_inf"] if "rewards" in scores else []),
                    *(["ref_inf"] if hp.uses_reference else []),
                ],
                eval_mfcs=[
                    mfc(
                        "eval",
                        "adv",
                        ModelInterfaceType.INFERENCE,
                        ModelInterfaceAbstraction("ppo_eval", {"ppo": hp, "scores": list(scores)}),
                        self.dataset.train_bs_n_seqs,
                        eval_inputs(hp, scores),
                    )
                ],
                eval_batch_size=self.eval_prompts,
            )
        exp = experiment_config(
            self, nodes, models, [self.dataset.abstraction(prompts)], tokenizer, **evaluation, **extra
        )
        if hp.router_replay:  # refused for a dense or pipelined actor, multi-turn rollouts
            check_router_replay(hp, exp, task_model_config(self))
        return exp

    def resolved_ppo(self) -> PPOHyperparameters:
        """``ppo`` with ``decoupled_loss`` decided: on under asynchronous RL unless set."""
        decoupled = self.async_rl.enabled if self.ppo.decoupled_loss is None else self.ppo.decoupled_loss
        return dataclasses.replace(self.ppo, decoupled_loss=decoupled)

    @property
    def uses_reward_model(self) -> bool:
        """A trained reward model scores the rollouts (not a reward function or custom interface;
        with an environment, only when ``rew.path`` names one)."""
        return self.reward_fn is None and (not self.takes_turns or self.rew.path is not None)

    @property
    def takes_turns(self) -> bool:
        """Generation runs trajectories with an environment or an agent, which score them."""
        return self.env is not None or self.agent is not None

    @property
    def scores(self) -> tuple[str, ...]:
        """The graph's scores (``ppo_keys.score_keys``): the reward call's, the environment's."""
        # without an environment or an agent a reward call always scores (a reward model, a
        # reward function, or a subclass's own reward interface)
        reward_call = not self.takes_turns or self.reward_fn is not None or self.uses_reward_model
        return score_keys(reward_call, self.takes_turns)

    @property
    def uses_critic(self) -> bool:
        return self.ppo.uses_critic

    def _actor_interface(self) -> str:
        return "ppo_actor"


register_quickstart_exp("ppo", PPOConfig)
