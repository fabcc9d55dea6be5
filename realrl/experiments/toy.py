"""The embedded default: where the toy task's data and prerequisite checkpoints live.

With no dataset path, every experiment runs on the toy task (README.md, "What the main job
does"). Its files are built once per seed under ``fileroot/toy_task/seed<seed>/`` and read
through the same dataset, tokenizer and model code paths as a user's local files and HF
checkpoints.
"""

from __future__ import annotations

import dataclasses
import os

from realrl.impl.dataset.toy import ToyTaskConfig, build_toy_task
from realrl.impl.dataset.toy.corpus import toy_model_config, toy_paths

TOY_N_PROMPTS = 50000  # "2,4,4": ~10k SFT examples, ~16k RM pairs, ~20k PPO prompts


@dataclasses.dataclass(frozen=True)
class ToyLayout:
    fileroot: str
    seed: int

    @property
    def data_dir(self) -> str:
        return os.path.join(os.path.abspath(self.fileroot), "toy_task", f"seed{self.seed}")

    def build(self, n_prompts: int = TOY_N_PROMPTS) -> dict[str, str]:
        """Write (or reuse) the corpus, tokenizer and phase files; return their paths."""
        build_toy_task(self.data_dir, ToyTaskConfig(seed=self.seed, n_prompts=n_prompts))
        return toy_paths(self.data_dir)

    @property
    def tokenizer(self) -> str:
        return toy_paths(self.data_dir)["tokenizer"]

    @staticmethod
    def model_config() -> dict:
        return toy_model_config()

    def trial(self) -> str:
        """The trial name of every toy run of this seed, so later phases find earlier ones."""
        return f"toy-seed{self.seed}"

    def checkpoint(self, experiment_name: str, role: str) -> str:
        return final_checkpoint(self.fileroot, experiment_name, self.trial(), role)


def final_checkpoint(fileroot: str, experiment_name: str, trial_name: str, role: str) -> str:
    """Where a run saves the final HF checkpoint of ``role``."""
    return os.path.join(os.path.abspath(fileroot), experiment_name, trial_name, "checkpoints", role, "final")


def has_checkpoint(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "config.json"))
