"""On-policy distillation ("On-Policy Distillation", Thinking Machines Lab 2025; verl's
distillation trainer): the student samples, a frozen teacher scores every sampled token, and each
token's reward is minus the reverse KL (student log-prob - teacher log-prob of that token).

    actor_gen -> {teacher_inf, actor_inf, rew_inf?} -> compute_adv -> actor_train

``teacher_inf`` is the reference-model call of the PPO graph on the ``teacher`` role (its own
checkpoint: any registered family and size, the student's vocabulary); ``actor_inf`` is the same
call on the student, so both log-probs come from a forward pass alike; ``compute_adv``
(``opd_reward``) turns them into advantages (discount 0, no critic) and ``actor_train`` is the
PPO actor's update. ``reward_fn=...`` adds a reward call whose score is only watched.
"""

from __future__ import annotations

import dataclasses
import json
import os

from realrl.api.core.config import ModelAbstraction, ModelBackendAbstraction, ModelInterfaceAbstraction
from realrl.api.core.data_api import MicroBatchSpec
from realrl.api.core.dfg import MFCDef, ModelInterfaceType
from realrl.api.core.system_api import ExperimentConfig, ModelSpec
from realrl.api.quickstart.entrypoint import register_quickstart_exp
from realrl.experiments.common import ModelTrainEvalConfig, experiment_config, mfc
from realrl.experiments.ppo import PPOConfig
from realrl.impl.interface.opd_keys import (
    OPD_INPUTS,
    OPD_OUTPUTS,
    OPD_TRAIN_KEYS,
    STUDENT_LOGPROBS,
    TEACHER_LOGPROBS,
)
from realrl.impl.interface.ppo_config import PPOHyperparameters, make_ppo_hyperparameters
from realrl.impl.interface.ppo_keys import rollout_keys

GEN, INF, TRAIN = ModelInterfaceType.GENERATE, ModelInterfaceType.INFERENCE, ModelInterfaceType.TRAIN_STEP


def opd_hyperparameters() -> PPOHyperparameters:
    """The student's update: GRPO's clipped token ratio with no KL term, the advantage each
    token's own reward (discount 0), not whitened, as in the blog."""
    hp = make_ppo_hyperparameters(preset="grpo")
    return dataclasses.replace(hp, kl_loss_coef=0.0, discount=0.0, adv_norm=False)


def opd_mfcs(
    n_seqs: int,
    hp: PPOHyperparameters,
    actor: ModelInterfaceAbstraction,
    advantages: ModelInterfaceAbstraction,
    mb_specs: dict[str, MicroBatchSpec] | None = None,
    reward: ModelInterfaceAbstraction | None = None,
) -> list[MFCDef]:
    """The distillation graph (module docstring); ``actor``: the PPO actor's interface, which
    serves generation, both log-prob calls and the update; ``reward``: a watched reward call."""
    mb = mb_specs or {}
    ref_logprobs = "packed_ref_logprobs"  # what the actor's inference writes and its update reads
    nodes = [
        mfc(
            "actor_gen",
            "actor",
            GEN,
            actor,
            n_seqs,
            ("packed_prompts",),
            rollout_keys(hp),
            mb.get("actor_gen"),
        ),
    ]
    for name, role, key in (
        ("teacher_inf", "teacher", TEACHER_LOGPROBS),
        ("actor_inf", "actor", STUDENT_LOGPROBS),
    ):
        node = mfc(name, role, INF, actor, n_seqs, ("packed_input_ids",), (key,), mb.get(name))
        nodes.append(dataclasses.replace(node, output_key_remap={ref_logprobs: key}))
    inputs = OPD_INPUTS
    if reward is not None:
        inputs += ("rewards",)
        nodes.append(
            mfc("rew_inf", "reward", INF, reward, n_seqs, ("packed_input_ids", "prompt_mask"), ("rewards",))
        )
    adv = mfc("compute_adv", "adv", INF, advantages, n_seqs, inputs, OPD_OUTPUTS)
    nodes.append(dataclasses.replace(adv, whole_batch=True))
    train = mfc(
        "actor_train", "actor", TRAIN, actor, n_seqs, OPD_TRAIN_KEYS, (), mb.get("actor_train"), log=True
    )
    nodes.append(dataclasses.replace(train, input_key_remap={TEACHER_LOGPROBS: ref_logprobs}))
    return nodes


@dataclasses.dataclass
class OPDConfig(PPOConfig):
    """The PPO experiment's options with a ``teacher`` role; ``ppo.*`` configure the student's
    update (``ppo.discount`` and ``ppo.adv_norm`` its advantages; no estimator, critic or KL
    controller is read)."""

    teacher: ModelTrainEvalConfig = dataclasses.field(default_factory=ModelTrainEvalConfig)
    ppo: PPOHyperparameters = dataclasses.field(default_factory=opd_hyperparameters)
    teacher_kl_coef: float = 1.0  # the reverse KL's weight in the per-token reward

    SUMMARY = "On-policy distillation: a teacher's per-token reverse KL as the student's reward"
    CURVES = {
        "reverse_kl": ["compute_adv/reverse_kl"],
        "reward": ["compute_adv/task_reward"],
        "loss": ["actor_train/loss"],
        "length": ["compute_adv/response_length"],
    }
    PROGRESS = {
        "rkl": ("compute_adv/reverse_kl",),
        "reward": ("compute_adv/task_reward",),
        "loss": ("actor_train/loss",),
    }

    def __post_init__(self) -> None:
        super().__post_init__()
        refusals = (
            (self.teacher_kl_coef <= 0, f"teacher_kl_coef must be > 0, got {self.teacher_kl_coef}"),
            (
                self.ppo.uses_critic,
                f"opd trains no critic: ppo.adv_estimator={self.ppo.adv_estimator!r} needs one",
            ),
            (self.takes_turns, "opd distils single-turn answers: env=/agent= are not supported"),
            (
                self.dynamic_sampling.enabled,
                "opd has no group scores to filter: dynamic_sampling.enabled=false",
            ),
            (self.async_rl.enabled, "opd runs synchronously: async_rl.enabled=false"),
            (
                self.exp_ctrl.eval_freq_steps is not None,
                "opd has no held-out evaluation during training (exp_ctrl.eval_freq_steps); an embedded "
                "task's summary evaluates the final student",
            ),
        )
        for refused, message in refusals:
            if refused:
                raise ValueError(message)

    def unused_groups(self) -> set[str]:
        return {"critic", "ref", "rew"}

    @property
    def uses_reward_model(self) -> bool:
        return False

    def initial_setup(self) -> ExperimentConfig:
        self.experiment_name = self.experiment_name or "opd"
        tokenizer = self.tokenizer_path or self.actor.path
        check_same_vocabulary(self.actor.path, self.teacher.path)
        hp = self.resolved_ppo()
        actor_iface = ModelInterfaceAbstraction(self._actor_interface(), {"ppo": hp})
        adv_iface = ModelInterfaceAbstraction(
            "opd_reward", {"kl_coef": self.teacher_kl_coef, "discount": hp.discount, "adv_norm": hp.adv_norm}
        )
        hint = " (the distilled model; on an embedded task leave it unset to train one by RL first)"
        null = ModelAbstraction("null", {"tokenizer_path": tokenizer} if tokenizer else {})
        models = {
            "actor": ModelSpec(
                self.actor.model(False, tokenizer_path=tokenizer, key="actor"),
                self.actor.backend(trainable=True, key="actor"),
                keep_gen_copy=self.actor.keep_gen_copy,
            ),
            "teacher": ModelSpec(
                self.teacher.model(False, tokenizer_path=tokenizer, key="teacher", hint=hint),
                self.teacher.backend(trainable=False, key="teacher"),
            ),
            "adv": ModelSpec(null, ModelBackendAbstraction("null")),
        }
        reward = None
        if self.reward_fn is not None:
            models["reward"], reward = self.reward_spec(tokenizer, None)
        mb_specs = {
            "actor_gen": self.actor.mb_spec(),
            "actor_inf": self.actor.mb_spec(),
            "actor_train": self.actor.mb_spec(),
            "teacher_inf": self.teacher.mb_spec(),
        }
        nodes = opd_mfcs(self.dataset.train_bs_n_seqs, hp, actor_iface, adv_iface, mb_specs, reward)
        return experiment_config(
            self, nodes, models, [self.dataset.abstraction(self.dataset.path)], tokenizer
        )


def check_same_vocabulary(student: str | None, teacher: str | None) -> None:
    """The teacher scores the student's token ids: both checkpoints (when already there) must
    have one vocabulary size."""
    sizes = {}
    for key, path in (("actor.path", student), ("teacher.path", teacher)):
        config = os.path.join(path or "", "config.json")
        if path and os.path.isfile(config):
            with open(config) as f:
                sizes[key] = json.load(f).get("vocab_size")
    if len(sizes) == 2 and len(set(sizes.values())) == 2:
        raise ValueError(
            f"teacher.path={teacher} has a vocabulary of {sizes['teacher.path']} tokens and actor.path="
            f"{student} of {sizes['actor.path']}: the teacher must score the student's tokens (one tokenizer)"
        )


register_quickstart_exp("opd", OPDConfig)
