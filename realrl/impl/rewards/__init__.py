"""Verifiable reward functions, registered by name when this package is imported.

Each is ``fn(prompts, completions, **kwargs) -> list[float]``: ``kwargs`` are the samples'
metadata (dataset row fields named by ``dataset.metadata_keys``, one entry per completion) and
``reward_fn_kwargs``. Use one with ``reward_fn=<name>``:

- ``math_answer`` / ``gsm8k``: the final answer (last ``\\boxed{}``, ``#### n``, or last number)
  equals the row's ``answer`` as a number or normalised text;
- ``exact_match``: the completion equals ``answer`` (stripped, optionally case-folded);
- ``regex_match``: ``pattern`` matches (``{answer}`` in it: the escaped reference);
- ``format``: the whole completion has a required form (think/answer tags, boxed, ``#### n``);
- ``combined`` / ``weighted_sum``: a weighted sum of the others.
"""

from realrl.impl.rewards import combine, format, match, math_answer  # noqa: F401
from realrl.impl.rewards.answers import answers_match, extract_answer, parse_number, reference_answer

__all__ = ["answers_match", "extract_answer", "parse_number", "reference_answer"]
