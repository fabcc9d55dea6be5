"""An example reward plugin: any function ``fn(prompts, completions, **metadata) -> list[float]``.

Use it as the reward node of PPO or GRPO without writing an interface, in one of three ways:

    # 1. by file path on the command line
    python -m realrl.apps.quickstart ppo reward_fn=examples/reward_plugin.py:echo_and_brevity_reward
    # 2. by module path, when the file is importable (on PYTHONPATH)
    python -m realrl.apps.quickstart ppo reward_fn=reward_plugin:echo_and_brevity_reward
    # 3. by name, after registering it in code that runs before the experiment starts
    from realrl.api.core.model_api import register_reward_fn
    register_reward_fn("echo_and_brevity", echo_and_brevity_reward)

The function is called in batches on the worker that holds the samples. ``metadata`` holds the
dataset's per-sample metadata, one entry per completion, plus the interface's ``fn_kwargs``.
Return one finite float per completion: an exception, a wrong length or a NaN stops the run with
this function's traceback and the ids of the samples it was scoring.
"""

from __future__ import annotations


def echo_and_brevity_reward(
    prompts: list[str], completions: list[str], target_words: int = 8, **metadata
) -> list[float]:
    """+1 for each prompt word the completion repeats (at most 3), minus the distance of the
    completion's length from ``target_words``, in units of ``target_words``."""
    scores = []
    for prompt, completion in zip(prompts, completions):
        words = completion.split()
        echoed = len(set(prompt.split()) & set(words))
        scores.append(min(echoed, 3) - abs(len(words) - target_words) / target_words)
    return scores
