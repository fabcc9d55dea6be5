"""The "my-ppo" example of ReaL's documentation: PPO whose reward node is a custom interface.

A reward interface is registered with ``register_interface``; an experiment subclassing
``PPOConfig`` swaps the ``rew_inf`` call over to it (the reward model is no longer loaded: a
tokenizer-only "null" model takes its place); ``register_quickstart_exp`` makes it runnable:

    python examples/my_ppo.py my-ppo experiment_name=sentiment-ppo trial_name=test ppo.kl_ctl=0.1

Every worker imports this file (``import_modules``) so it finds the interface too.
"""

from __future__ import annotations

import dataclasses
import os

import torch

from realrl.api.core.config import ModelAbstraction, ModelBackendAbstraction, ModelInterfaceAbstraction
from realrl.api.core.data_api import MicroBatchSpec, SequenceSample
from realrl.api.core.model_api import Model, ModelInterface, register_interface
from realrl.api.core.system_api import ExperimentConfig, ModelSpec
from realrl.api.quickstart.entrypoint import register_quickstart_exp
from realrl.experiments.ppo import PPOConfig
from realrl.impl.interface.texts import prompts_and_completions

POSITIVE = {"good", "great", "happy", "joy", "love", "nice", "kind", "bright", "calm", "brave"}


@dataclasses.dataclass
class SentimentScoringInterface(ModelInterface):
    """Scores decoded completions: +1 per positive word, -0.5 per word beyond ``max_words``.

    In ReaL's documentation this re-tokenizes the texts for a BERT-like classifier; any scorer fits
    here."""

    max_words: int = 12

    def inference(self, model: Model, data: SequenceSample, mb_spec: MicroBatchSpec | None = None):
        _, _, completions = prompts_and_completions(data, model.tokenizer)
        scores = []
        for text in completions:
            words = text.split()
            scores.append(sum(w in POSITIVE for w in words) - 0.5 * max(0, len(words) - self.max_words))
        seqlens = [len(lens) * [1] for lens in data.seqlens["packed_input_ids"]]
        return SequenceSample.from_default(
            data.ids, seqlens, {"rewards": torch.tensor(scores, dtype=torch.float32)}
        )


register_interface("sentiment_scoring", SentimentScoringInterface)


@dataclasses.dataclass
class MyPPOConfig(PPOConfig):
    scoring_max_words: int = 12

    @property
    def uses_reward_model(self) -> bool:
        return False  # no reward model to train or load; rew_inf also gets prompt_mask

    def reward_spec(self, tokenizer, path):
        # Remove the reward model: the custom interface only needs the tokenizer to decode.
        model = ModelAbstraction("null", {"tokenizer_path": tokenizer} if tokenizer else {})
        interface = ModelInterfaceAbstraction("sentiment_scoring", {"max_words": self.scoring_max_words})
        return ModelSpec(model, ModelBackendAbstraction("null")), interface

    def initial_setup(self) -> ExperimentConfig:
        self.experiment_name = self.experiment_name or "my-ppo"
        cfg = super().initial_setup()
        cfg.import_modules.append(os.path.abspath(__file__))  # workers register the interface too
        return cfg


register_quickstart_exp("my-ppo", MyPPOConfig)


if __name__ == "__main__":
    from realrl.apps.quickstart import main

    main()
