"""Generation only: sample answers to a prompt set and write them as JSON lines."""

from __future__ import annotations

import dataclasses
import os

from realrl.api.core.config import ModelInterfaceAbstraction
from realrl.api.core.dfg import ModelInterfaceType
from realrl.api.core.model_api import GenerationHyperparameters
from realrl.api.core.system_api import ExperimentConfig, ModelSpec
from realrl.api.quickstart.base import CommonExperimentConfig
from realrl.api.quickstart.entrypoint import register_quickstart_exp
from realrl.experiments.common import ModelTrainEvalConfig, experiment_config, mfc
from realrl.experiments.datasets import PromptOnlyDatasetConfig
from realrl.impl.interface.ppo_keys import ROLLOUT_KEYS


@dataclasses.dataclass
class GenerationConfig(CommonExperimentConfig):
    model: ModelTrainEvalConfig = dataclasses.field(default_factory=ModelTrainEvalConfig)
    dataset: PromptOnlyDatasetConfig = dataclasses.field(default_factory=PromptOnlyDatasetConfig)
    gen: GenerationHyperparameters = dataclasses.field(default_factory=GenerationHyperparameters)
    output_file: str | None = None  # default: <run dir>/generations.jsonl
    tokenizer_path: str | None = None

    def initial_setup(self) -> ExperimentConfig:
        self.experiment_name = self.experiment_name or "gen"
        prompts, tokenizer, path = self.dataset.path, self.tokenizer_path, self.model.path
        tokenizer = tokenizer or path
        model = dataclasses.replace(self.model, path=path)
        output = self.output_file or os.path.join(self.run_dir, "generations.jsonl")
        iface = ModelInterfaceAbstraction(
            "generation", {"gconfig": dataclasses.asdict(self.gen), "output_file": output}
        )
        node = mfc(
            "gen",
            "default",
            ModelInterfaceType.GENERATE,
            iface,
            self.dataset.train_bs_n_seqs,
            ("packed_prompts",),
            ROLLOUT_KEYS,
            self.model.mb_spec(),
        )
        specs = {
            "default": ModelSpec(
                model.model(False, tokenizer_path=tokenizer, key="model"), model.backend(trainable=False)
            )
        }
        return experiment_config(self, [node], specs, [self.dataset.abstraction(prompts)], tokenizer)


register_quickstart_exp("gen", GenerationConfig)
