"""Reward modeling (DeepSpeed-Chat's phase 2, TRL's RewardTrainer): a scalar-head model trained on
preference pairs."""

from __future__ import annotations

import dataclasses

from realrl.api.core.config import ModelInterfaceAbstraction
from realrl.api.core.dfg import ModelInterfaceType
from realrl.api.core.system_api import ExperimentConfig, ModelSpec
from realrl.api.quickstart.base import CommonExperimentConfig
from realrl.api.quickstart.entrypoint import register_quickstart_exp
from realrl.experiments.common import ModelTrainEvalConfig, experiment_config, mfc
from realrl.experiments.datasets import PairedComparisonDatasetConfig


@dataclasses.dataclass
class RWConfig(CommonExperimentConfig):
    SUMMARY = "Reward modeling (DeepSpeed-Chat's phase 2): a scalar head on preference pairs."

    model: ModelTrainEvalConfig = dataclasses.field(default_factory=ModelTrainEvalConfig)
    dataset: PairedComparisonDatasetConfig = dataclasses.field(default_factory=PairedComparisonDatasetConfig)
    center_rewards_coefficient: float | None = None  # TRL's option: + coef * mean((r_c + r_r)^2)
    tokenizer_path: str | None = None

    CURVES = {
        "loss": ["rwTrain/loss"],
        "accuracy": ["rwTrain/accuracy"],
        "pair_reward": ["rwTrain/chosen_reward", "rwTrain/rejected_reward"],
    }
    PROGRESS = {"accuracy": ("rwTrain/accuracy",), "loss": ("rwTrain/loss",)}

    def initial_setup(self) -> ExperimentConfig:
        self.experiment_name = self.experiment_name or "rw"
        train_path, valid_path = self.dataset.train_path, self.dataset.valid_path
        tokenizer, path = self.tokenizer_path, self.model.path
        model_cfg = dataclasses.replace(self.model, path=path)
        tokenizer = tokenizer or path
        model = ModelSpec(
            model_cfg.model(is_critic=True, tokenizer_path=tokenizer, key="model"),
            model_cfg.backend(trainable=True, key="model"),
        )
        interface = ModelInterfaceAbstraction(
            "paired_rw", {"center_rewards_coefficient": self.center_rewards_coefficient}
        )
        train = mfc(
            "rwTrain",
            "default",
            ModelInterfaceType.TRAIN_STEP,
            interface,
            self.dataset.train_bs_n_seqs,
            ("packed_input_ids", "margins") if self.dataset.margin_key else ("packed_input_ids",),
            mb_spec=self.model.mb_spec(),
            log=True,
        )
        valid = [self.dataset.abstraction(valid_path)] if valid_path else []
        return experiment_config(
            self, [train], {"default": model}, [self.dataset.abstraction(train_path)], tokenizer, valid
        )


register_quickstart_exp("rw", RWConfig)
