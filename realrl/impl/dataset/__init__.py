"""Registered datasets: ``prompt_answer`` (SFT), ``rw_paired`` (reward modeling), ``prompt``
(PPO / GRPO) and ``dschat`` (DeepSpeed-Chat sources split by phase). See docs/datasets.md."""

from realrl.impl.dataset import dschat, prompt, prompt_answer, rw_paired  # noqa: F401  (register)
from realrl.impl.dataset.collators import DataCollatorForPreference, preference_examples
from realrl.impl.dataset.errors import DataError

__all__ = ["DataCollatorForPreference", "DataError", "preference_examples"]
