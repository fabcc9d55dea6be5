"""Supervised fine-tuning (DeepSpeed-Chat's phase 1): one MFC, ``default`` trains on prompt + answer."""

from __future__ import annotations

import dataclasses

from realrl.api.core.config import ModelInterfaceAbstraction
from realrl.api.core.dfg import ModelInterfaceType
from realrl.api.core.system_api import ExperimentConfig, ModelSpec
from realrl.api.quickstart.base import CommonExperimentConfig
from realrl.api.quickstart.entrypoint import register_quickstart_exp
from realrl.experiments.common import ModelTrainEvalConfig, experiment_config, mfc, task_model_config
from realrl.experiments.datasets import PromptAnswerDatasetConfig


@dataclasses.dataclass
class SFTConfig(CommonExperimentConfig):
    SUMMARY = "Supervised fine-tuning (DeepSpeed-Chat's phase 1): trains on prompt and answer."

    model: ModelTrainEvalConfig = dataclasses.field(default_factory=ModelTrainEvalConfig)
    dataset: PromptAnswerDatasetConfig = dataclasses.field(default_factory=PromptAnswerDatasetConfig)
    tokenizer_path: str | None = None  # default: model.path

    CURVES = {"loss": ["trainDefault/loss"], "perplexity": ["trainDefault/ppl"]}
    PROGRESS = {"loss": ("trainDefault/loss",)}

    def initial_setup(self) -> ExperimentConfig:
        self.experiment_name = self.experiment_name or "sft"
        train_path, valid_path = self.dataset.train_path, self.dataset.valid_path
        tokenizer = self.tokenizer_path or self.model.path
        default_model = task_model_config(self)  # an embedded task's model starts from scratch
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
