"""A two-line environment: the model answers an arithmetic problem and, when wrong, is told so
and may try again. Run it on the embedded arithmetic task:

    python -m realrl.apps.quickstart grpo task=arith env=examples/envs/retry.py:Retry ppo.max_turns=2
"""

from realrl.impl.rewards.math_answer import math_answer_reward


class Retry:
    def __init__(self, prompt: str, answer: str, **_):
        self.prompt, self.answer = prompt, answer

    def step(self, completion: str):
        right = math_answer_reward([self.prompt], [completion], answer=[self.answer])[0] > 0
        if right:
            return None, 1.0, True
        return "=?", 0.0, False  # wrong: the problem's "=?" again, and another turn
