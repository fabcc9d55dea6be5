"""DPO: ``ref_inf`` scores both answers of each pair with the frozen reference, ``actor_train``
minimises the sigmoid (or IPO) loss against it."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from realrl.api.core.config import ModelInterfaceAbstraction
from realrl.api.core.dfg import ModelInterfaceType
from realrl.api.core.system_api import ExperimentConfig, ModelSpec
from realrl.api.quickstart.base import CommonExperimentConfig, check_choice
from realrl.api.quickstart.entrypoint import register_quickstart_exp
from realrl.experiments.common import ModelTrainEvalConfig, experiment_config, mfc, toy_mode
from realrl.experiments.datasets import PairedComparisonDatasetConfig
from realrl.experiments.toy import ToyLayout


@dataclasses.dataclass
class DPOConfig(CommonExperimentConfig):
    actor: ModelTrainEvalConfig = dataclasses.field(default_factory=ModelTrainEvalConfig)
    ref: ModelTrainEvalConfig = dataclasses.field(default_factory=ModelTrainEvalConfig)
    dataset: PairedComparisonDatasetConfig = dataclasses.field(default_factory=PairedComparisonDatasetConfig)
    beta: float = 0.1
    loss_type: str = "sigmoid"  # sigmoid | ipo
    label_smoothing: float = 0.0
    tokenizer_path: str | None = None

    TOY_PRESET: ClassVar[list[str]] = [
        "exp_ctrl.total_train_epochs=1",
        "actor.optimizer.lr=1e-4",
        "dataset.train_bs_n_seqs=64",
        "dataset.max_seqlen=64",
        "dataset.max_pairs_per_prompt=1",
    ]

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice("loss_type", self.loss_type, ("sigmoid", "ipo"))
        if self.beta <= 0:
            raise ValueError(f"beta must be > 0, got {self.beta}")

    def prerequisites(self) -> list[tuple[str, list[str]]]:
        return [("sft", [])] if toy_mode(self.dataset.train_path) else []

    def initial_setup(self) -> ExperimentConfig:
        self.experiment_name = self.experiment_name or "dpo"
        train_path, valid_path = self.dataset.train_path, self.dataset.valid_path
        tokenizer, actor_path = self.tokenizer_path, self.actor.path
        if toy_mode(train_path):
            toy = ToyLayout(self.fileroot, self.seed)
            paths = toy.build()
            train_path, valid_path, tokenizer = paths["rm_train"], paths["rm_valid"], toy.tokenizer
            actor_path = actor_path or toy.checkpoint("sft", "default")
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
            "ref": ModelSpec(
                ref.model(False, tokenizer_path=tokenizer, key="ref"), ref.backend(trainable=False)
            ),
        }
        valid = [self.dataset.abstraction(valid_path)] if valid_path else []
        return experiment_config(
            self, nodes, models, [self.dataset.abstraction(train_path)], tokenizer, valid
        )


register_quickstart_exp("dpo", DPOConfig)
