"""PPO ("The N Implementation Details of RLHF with PPO"; call names as in ReaL, docs/algorithms.md).

actor_gen -> {rew_inf, ref_inf, critic_inf} -> {actor_train, critic_train}. The reward node is the
trained reward model, or any registered reward function / interface (``reward_fn=module:function``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from realrl.api.core.config import ModelAbstraction, ModelBackendAbstraction, ModelInterfaceAbstraction
from realrl.api.core.data_api import MicroBatchSpec
from realrl.api.core.dfg import MFCDef, ModelInterfaceType
from realrl.api.core.system_api import ExperimentConfig, ModelSpec
from realrl.api.quickstart.base import CommonExperimentConfig, check_choice
from realrl.api.quickstart.entrypoint import register_quickstart_exp
from realrl.experiments.common import ModelTrainEvalConfig, experiment_config, mfc, toy_mode
from realrl.experiments.datasets import PromptOnlyDatasetConfig
from realrl.experiments.toy import ToyLayout, final_checkpoint
from realrl.impl.interface.ppo_config import PPOHyperparameters

PPO_DATASET_KEYS = ("packed_prompts",)
ROLLOUT_KEYS = ("packed_input_ids", "packed_logprobs", "prompt_mask", "seq_no_eos_mask")
TRAIN_KEYS = ROLLOUT_KEYS + ("packed_ref_logprobs", "rewards", "values")


def ppo_mfcs(
    n_seqs: int,
    actor: ModelInterfaceAbstraction | None = None,
    critic: ModelInterfaceAbstraction | None = None,
    reward: ModelInterfaceAbstraction | None = None,
    mb_specs: dict[str, MicroBatchSpec] | None = None,
    use_critic: bool = True,
    reward_inputs: tuple[str, ...] = ("packed_input_ids",),
) -> list[MFCDef]:
    """The PPO graph; without a critic (GRPO) the ``values`` key and both critic calls go.
    A reward plugin also reads ``prompt_mask`` (``reward_inputs``) to split prompt from answer."""
    actor = actor or ModelInterfaceAbstraction("ppo_actor")
    critic = critic or ModelInterfaceAbstraction("ppo_critic")
    reward = reward or ModelInterfaceAbstraction("paired_rw")
    mb = mb_specs or {}
    gen, inf, train = ModelInterfaceType.GENERATE, ModelInterfaceType.INFERENCE, ModelInterfaceType.TRAIN_STEP
    train_keys = TRAIN_KEYS if use_critic else tuple(k for k in TRAIN_KEYS if k != "values")
    nodes = [
        mfc("actor_gen", "actor", gen, actor, n_seqs, ("packed_prompts",), ROLLOUT_KEYS, mb.get("actor_gen")),
        mfc("rew_inf", "reward", inf, reward, n_seqs, reward_inputs, ("rewards",), mb.get("rew_inf")),
        mfc(
            "ref_inf",
            "ref",
            inf,
            actor,
            n_seqs,
            ("packed_input_ids",),
            ("packed_ref_logprobs",),
            mb.get("ref_inf"),
        ),
        mfc("actor_train", "actor", train, actor, n_seqs, train_keys, (), mb.get("actor_train"), log=True),
    ]
    if use_critic:
        nodes += [
            mfc(
                "critic_inf",
                "critic",
                inf,
                critic,
                n_seqs,
                ("packed_input_ids", "seq_no_eos_mask"),
                ("values",),
                mb.get("critic_inf"),
            ),
            mfc(
                "critic_train",
                "critic",
                train,
                critic,
                n_seqs,
                train_keys,
                (),
                mb.get("critic_train"),
                log=True,
            ),
        ]
    return nodes


@dataclasses.dataclass
class PPOConfig(CommonExperimentConfig):
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
    toy_eval_prompts: int = 800  # held-out prompts the toy task's summary samples
    tokenizer_path: str | None = None

    TOY_PRESET: ClassVar[list[str]] = [
        "exp_ctrl.total_train_steps=30",
        "dataset.train_bs_n_seqs=256",
        "dataset.max_prompt_len=16",
        "actor.optimizer.lr=1e-4",
        "critic.optimizer.lr=3e-4",
        "ppo.gen.max_new_tokens=13",
        "ppo.gen.top_p=1.0",
        "ppo.gen.top_k=0",
        "ppo.gen.temperature=1.0",
        "ppo.kl_ctl=0.1",
        "ppo.gae_lambda=0.95",
        "ppo.ppo_n_epochs=4",
        "ppo.ppo_n_minibatches=4",
    ]

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice("critic_head_init", self.critic_head_init, ("reward", "zeros"))
        if self.toy_eval_prompts < 1:
            raise ValueError(f"toy_eval_prompts must be >= 1, got {self.toy_eval_prompts}")

    def prerequisites(self) -> list[tuple[str, list[str]]]:
        if not toy_mode(self.dataset.path):
            return []
        return [("sft", []), ("rw", [])] if self.uses_reward_model else [("sft", [])]

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
        actor_path, rew_path = self.actor.path, self.rew.path
        ref_path, critic_path = self.ref.path, self.critic.path
        if toy_mode(prompts):
            toy = ToyLayout(self.fileroot, self.seed)
            prompts, tokenizer = toy.build()["ppo_train"], toy.tokenizer
            actor_path = actor_path or toy.checkpoint("sft", "default")
            if self.uses_reward_model:
                rew_path = rew_path or toy.checkpoint("rw", "default")
        ref_path = ref_path or actor_path
        critic_path = (
            critic_path or rew_path or actor_path
        )  # critic from the RM (the toy recipe), else the actor
        tokenizer = tokenizer or actor_path
        ppo = {"ppo": dataclasses.asdict(self.ppo)}
        actor_iface = ModelInterfaceAbstraction(self._actor_interface(), ppo)
        critic_iface = ModelInterfaceAbstraction("ppo_critic", ppo)
        actor = dataclasses.replace(self.actor, path=actor_path)
        ref = dataclasses.replace(self.ref, path=ref_path)
        critic = dataclasses.replace(self.critic, path=critic_path)
        models = {
            "actor": ModelSpec(
                actor.model(False, tokenizer_path=tokenizer, key="actor"),
                actor.backend(trainable=True, key="actor"),
                keep_gen_copy=actor.keep_gen_copy,
            ),
            "ref": ModelSpec(
                ref.model(False, tokenizer_path=tokenizer, key="ref"), ref.backend(trainable=False)
            ),
        }
        # after the actor's: with no model path at all, the message names actor.path first
        models["reward"], reward_iface = self.reward_spec(tokenizer, rew_path)
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
        nodes = ppo_mfcs(
            self.dataset.train_bs_n_seqs,
            actor_iface,
            critic_iface,
            reward_iface,
            mb_specs,
            self.uses_critic,
            reward_inputs,
        )
        return experiment_config(self, nodes, models, [self.dataset.abstraction(prompts)], tokenizer)

    def summarize(self) -> dict[str, Any]:
        """On the toy task: held-out true reward of the SFT and the trained policy, the final KL
        to the reference and the reward model's pair accuracy (the figures README.md reports)."""
        if not toy_mode(self.dataset.path):
            return {}
        from realrl.experiments.toy_eval import evaluate_policy, reward_model_accuracy

        toy = ToyLayout(self.fileroot, self.seed)
        paths = toy.build()
        sft = self.ref.path or toy.checkpoint("sft", "default")
        actor = final_checkpoint(self.fileroot, self.experiment_name, self.trial_name, "actor")
        gconfig = dataclasses.replace(self.ppo.gen, n=1)
        n = self.toy_eval_prompts
        before = evaluate_policy(sft, None, toy.tokenizer, paths["ppo_valid"], gconfig, n, seed=self.seed)
        after = evaluate_policy(actor, sft, toy.tokenizer, paths["ppo_valid"], gconfig, n, seed=self.seed)
        rm_accuracy = None
        if self.uses_reward_model:
            rm = self.rew.path or toy.checkpoint("rw", "default")
            rm_accuracy = reward_model_accuracy(rm, toy.tokenizer, paths["rm_valid"], seed=self.seed)
        return {
            "sft_true_reward_mean": before.true_reward_mean,
            "sft_true_reward_std": before.true_reward_std,
            "true_reward_mean": after.true_reward_mean,
            "true_reward_std": after.true_reward_std,
            "gain_in_sft_std": (after.true_reward_mean - before.true_reward_mean)
            / max(before.true_reward_std, 1e-8),
            "rm_accuracy": rm_accuracy,
            "kl": after.kl,
            "no_eos_fraction": after.no_eos_fraction,
            "samples": after.samples,
        }

    @property
    def uses_reward_model(self) -> bool:
        """A trained reward model scores the rollouts (not a reward function or custom interface)."""
        return self.reward_fn is None

    @property
    def uses_critic(self) -> bool:
        return self.ppo.adv_estimator == "gae"

    def _actor_interface(self) -> str:
        return "ppo_actor"


register_quickstart_exp("ppo", PPOConfig)
