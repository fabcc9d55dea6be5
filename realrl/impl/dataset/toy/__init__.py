"""The embedded toy task: a miniature InstructGPT pipeline that learns on 2 CPU cores.

A bigram language over ~200 words writes prompts and continuations; a hidden true reward
(positive minus negative words, -2 without a final '.') labels preference pairs. See
``build_toy_task`` for what it writes and README.md ("What the main job does") for what a default
run reaches.
"""

from realrl.impl.dataset.toy.corpus import ToyTaskConfig, build_toy_task, true_reward
from realrl.impl.dataset.toy.vocab import ToyVocab

__all__ = ["ToyTaskConfig", "ToyVocab", "build_toy_task", "true_reward"]
