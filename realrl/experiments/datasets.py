"""The ``dataset.*`` options of the quickstart experiments."""

from __future__ import annotations

import dataclasses

from realrl.api.core.config import DatasetAbstraction


def check_positive(config: object, *names: str) -> None:
    """Sizes and lengths are >= 1 (``None`` where allowed means no limit)."""
    for name in names:
        value = getattr(config, name)
        if value is not None and value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")


@dataclasses.dataclass
class PromptAnswerDatasetConfig:
    """SFT data: rows with a prompt and an answer (JSON, JSONL, Parquet, HF datasets folder)."""

    train_path: str = ""  # empty: the embedded toy task
    valid_path: str = ""
    prompt_key: str = "prompt"
    answer_key: str = "answer"
    max_seqlen: int = 1024
    train_bs_n_seqs: int = 64
    loss_on_prompt: bool = False  # DeepSpeed-Chat's phase 1 puts the loss on every token

    def __post_init__(self) -> None:
        check_positive(self, "max_seqlen", "train_bs_n_seqs")

    def abstraction(self, path: str) -> DatasetAbstraction:
        return DatasetAbstraction(
            "prompt_answer",
            {
                "dataset_path": path,
                "prompt_key": self.prompt_key,
                "answer_key": self.answer_key,
                "max_length": self.max_seqlen,
                "loss_on_prompt": self.loss_on_prompt,
            },
        )


@dataclasses.dataclass
class PairedComparisonDatasetConfig:
    """Reward-model and DPO data: a prompt with chosen and rejected answers."""

    train_path: str = ""
    valid_path: str = ""
    prompt_key: str = "prompt"
    chosen_key: str = "chosen"
    rejected_key: str = "rejected"
    margin_key: str | None = None  # a column of per-pair margins (reward modeling), e.g. "margin"
    max_seqlen: int = 1024
    max_pairs_per_prompt: int = 2
    train_bs_n_seqs: int = 64

    def __post_init__(self) -> None:
        check_positive(self, "max_seqlen", "max_pairs_per_prompt", "train_bs_n_seqs")

    def abstraction(self, path: str) -> DatasetAbstraction:
        return DatasetAbstraction(
            "rw_paired",
            {
                "dataset_path": path,
                "prompt_key": self.prompt_key,
                "chosen_key": self.chosen_key,
                "rejected_key": self.rejected_key,
                "margin_key": self.margin_key,
                "max_length": self.max_seqlen,
                "max_pairs_per_prompt": self.max_pairs_per_prompt,
            },
        )


@dataclasses.dataclass
class PromptOnlyDatasetConfig:
    """PPO / GRPO / generation data: prompts, and the row fields a reward function reads."""

    path: str = ""
    valid_path: str = ""
    prompt_key: str = "prompt"
    # row fields passed to the reward function, per completion, as keyword lists (e.g. [answer]
    # for a math checker: fn(prompts, completions, answer=[...]))
    metadata_keys: list[str] = dataclasses.field(default_factory=list)
    max_prompt_len: int = 256
    train_bs_n_seqs: int = 64

    def __post_init__(self) -> None:
        check_positive(self, "max_prompt_len", "train_bs_n_seqs")
        if self.prompt_key in self.metadata_keys:
            raise ValueError(f"metadata_keys {self.metadata_keys} include the prompt_key {self.prompt_key!r}")

    def abstraction(self, path: str) -> DatasetAbstraction:
        return DatasetAbstraction(
            "prompt",
            {
                "dataset_path": path,
                "prompt_key": self.prompt_key,
                "max_prompt_len": self.max_prompt_len,
                "metadata_keys": list(self.metadata_keys),
            },
        )
