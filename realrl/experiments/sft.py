"""Supervised fine-tuning (DeepSpeed-Chat's phase 1): one MFC, ``default`` trains on prompt + answer."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from realrl.api.core.config import ModelInterfaceAbstraction
from realrl.api.core.dfg import ModelInterfaceType
from realrl.api.core.system_api import ExperimentConfig, ModelSpec
from realrl.api.quickstart.base import CommonExperimentConfig
from realrl.api.quickstart.entrypoint import register_quickstart_exp
from realrl.experiments.common import ModelTrainEvalConfig, experiment_config, mfc
from realrl.experiments.datasets import PromptAnswerDatasetConfig
from realrl.experiments.toy import ToyLayout


@dataclasses.dataclass
class SFTConfig(CommonExperimentConfig):
    model: ModelTrainEvalConfig = dataclasses.field(default_factory=ModelTrainEvalConfig)
    dataset: PromptAnswerDatasetConfig = dataclasses.field(default_factory=PromptAnswerDatasetConfig)
    tokenizer_path: str | None = None  # default: model.path

    # applied before the user's overrides when no dataset path is given (the toy recipe's settings)
    TOY_PRESET: ClassVar[list[str]] = [
        "exp_ctrl.total_train_epochs=3",
        "model.optimizer.lr=3e-3",
        "model.optimizer.lr_scheduler_type=cosine",
        "model.optimizer.warmup_steps_proportion=0.1",
        "model.optimizer.min_lr_ratio=0.05",
        "model.optimizer.weight_decay=0.0",
        "dataset.train_bs_n_seqs=64",
        "dataset.max_seqlen=64",
    ]

    def initial_setup(self) -> ExperimentConfig:
        self.experiment_name = self.experiment_name or "sft"
        train_path, valid_path = self.dataset.train_path, self.dataset.valid_path
        tokenizer, default_model = self.tokenizer_path, None
        if not train_path:
            toy = ToyLayout(self.fileroot, self.seed)
            paths = toy.build()
            train_path, valid_path = paths["sft_train"], paths["sft_valid"]
            tokenizer, default_model = toy.tokenizer, toy.model_config()
        tokenizer = tokenizer or self.model.path
        model = ModelSpec(
            self.model.model(
                is_critic=False, default_config=default_model, tokenizer_path=tokenizer, key="model"
            ),
            self.model.backend(trainable=True, key="model"),
        )
        train = mfc(
            "trainDefault",
            "default",
            ModelInterfaceType.TRAIN_STEP,
            ModelInterfaceAbstraction("sft"),
            self.dataset.train_bs_n_seqs,
            ("packed_input_ids", "prompt_mask"),
            mb_spec=self.model.mb_spec(),
            log=True,
        )
        valid = [self.dataset.abstraction(valid_path)] if valid_path else []
        return experiment_config(
            self, [train], {"default": model}, [self.dataset.abstraction(train_path)], tokenizer, valid
        )


register_quickstart_exp("sft", SFTConfig)
