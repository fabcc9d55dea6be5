"""DPO: ``ref_inf`` scores both answers of each pair with the frozen reference, ``actor_train``
minimises the sigmoid (or IPO) loss against it."""

from __future__ import annotations

import dataclasses

from realrl.api.core.config import ModelInterfaceAbstraction
from realrl.api.core.dfg import ModelInterfaceType
from realrl.api.core.system_api import ExperimentConfig, ModelSpec
from realrl.api.quickstart.base import CommonExperimentConfig, check_choice
from realrl.api.quickstart.entrypoint import register_quickstart_exp
from realrl.experiments.common import (
    ModelTrainEvalConfig,
    experiment_config,
    mfc,
    ref_is_actor_base,
    reference_on_actor,
)
from realrl.experiments.datasets import PairedComparisonDatasetConfig


@dataclasses.dataclass
class DPOConfig(CommonExperimentConfig):
    SUMMARY = "DPO: the policy trained on preference pairs against a frozen reference."

    actor: ModelTrainEvalConfig = dataclasses.field(default_factory=ModelTrainEvalConfig)
    ref: ModelTrainEvalConfig = dataclasses.field(default_factory=ModelTrainEvalConfig)
    dataset: PairedComparisonDatasetConfig = dataclasses.field(default_factory=PairedComparisonDatasetConfig)
    beta: float = 0.1
    loss_type: str = "sigmoid"  # sigmoid | ipo
    label_smoothing: float = 0.0
    tokenizer_path: str | None = None
    # actor.lora.rank > 0 and ref.path the actor's base: ref_inf runs the actor with its adapters
    # off instead of a second copy of the weights; false loads ref.path apart
    ref_from_actor_base: bool = True

    CURVES = {
        "loss": ["actor_train/loss"],
        "accuracy": ["actor_train/accuracy"],
        "pair_reward": ["actor_train/chosen_reward", "actor_train/rejected_reward"],
    }
    PROGRESS = {"accuracy": ("actor_train/accuracy",), "loss": ("actor_train/loss",)}

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice("loss_type", self.loss_type, ("sigmoid", "ipo"))
        if self.beta <= 0:
            raise ValueError(f"beta must be > 0, got {self.beta}")

    def unused_groups(self) -> set[str]:
        """No ``ref`` when the LoRA actor's base is the reference."""
        return {"ref"} if ref_is_actor_base(self.ref_from_actor_base, self.actor, self.ref) else set()

    def initial_setup(self) -> ExperimentConfig:
        self.experiment_name = self.experiment_name or "dpo"
        train_path, valid_path = self.dataset.train_path, self.dataset.valid_path
        tokenizer, actor_path = self.tokenizer_path, self.actor.path
        ref_path = self.ref.path or actor_path
        tokenizer = tokenizer or actor_path
        actor = dataclasses.replace(self.actor, path=actor_path)
        ref = dataclasses.replace(self.ref, path=ref_path)
        iface = ModelInterfaceAbstraction(
            "dpo", {"beta": self.beta, "loss_type": self.loss_type, "label_smoothing": self.label_smoothing}
        )
        n = self.dataset.train_bs_n_seqs
        nodes = [
            mfc(
                "ref_inf",
                "ref",
                ModelInterfaceType.INFERENCE,
                iface,
                n,
                ("packed_input_ids",),
                ("packed_ref_logprobs",),
                self.ref.mb_spec(),
            ),
            mfc(
                "actor_train",
                "actor",
                ModelInterfaceType.TRAIN_STEP,
                iface,
                n,
                ("packed_input_ids", "packed_ref_logprobs"),
                mb_spec=self.actor.mb_spec(),
                log=True,
            ),
        ]
        models = {
            "actor": ModelSpec(
                actor.model(False, tokenizer_path=tokenizer, key="actor"),
                actor.backend(trainable=True, key="actor"),
            ),
        }
        if ref_is_actor_base(self.ref_from_actor_base, self.actor, self.ref):
            nodes = reference_on_actor(nodes)
        else:
            models["ref"] = ModelSpec(
                ref.model(False, tokenizer_path=tokenizer, key="ref"), ref.backend(trainable=False)
            )
        valid = [self.dataset.abstraction(valid_path)] if valid_path else []
        return experiment_config(
            self, nodes, models, [self.dataset.abstraction(train_path)], tokenizer, valid
        )


register_quickstart_exp("dpo", DPOConfig)
