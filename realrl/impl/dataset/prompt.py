"""``prompt``: prompts only, for PPO / GRPO generation (DeepSpeed-Chat's phase 3)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from realrl.api.core.data_api import DatasetUtility, register_dataset
from realrl.impl.dataset.base import RowDataset, Skip
from realrl.impl.dataset.errors import get_field
from realrl.impl.dataset.samples import prompt_sample
from realrl.impl.dataset.sources import DataSource
from realrl.impl.dataset.tokenize import to_ids


class PromptDataset(RowDataset):
    """Each item: ``packed_prompts``, the prompt's token ids (text, chat messages rendered with the
    generation prompt, or token ids). Prompts longer than ``max_prompt_len`` are left out (never
    cut, which would change the question) and their count is logged and kept in ``dropped``.
    ``metadata_keys`` carries row fields (e.g. a reference answer) to reward plugins."""

    dataset_name = "prompt"

    def __init__(
        self,
        util: DatasetUtility,
        dataset_path: DataSource | None = None,
        dataset_builder: Callable[[], Any] | None = None,
        split: str | None = None,
        prompt_key: str = "prompt",
        max_prompt_len: int | None = None,
        id_key: str | None = None,
        metadata_keys: Sequence[str] = (),
    ):
        self.prompt_key = prompt_key
        self.max_prompt_len = max_prompt_len
        super().__init__(util, dataset_path, dataset_builder, split, id_key, metadata_keys)

    def row_texts(self, row):
        prompt = row.get(self.prompt_key)
        return [(prompt, True)] if isinstance(prompt, str) else []

    def build_row(self, row, where, id_, meta, dropped):
        prompt = get_field(row, self.prompt_key, (str, list), where)
        ids = to_ids(self.tok, prompt, self.prompt_key, where, add_generation_prompt=True)
        if not ids:
            raise Skip("empty prompt")
        if self.max_prompt_len is not None and len(ids) > self.max_prompt_len:
            raise Skip(f"prompt longer than max_prompt_len={self.max_prompt_len}")
        return prompt_sample(id_, ids, meta)


register_dataset(PromptDataset.dataset_name, PromptDataset)
