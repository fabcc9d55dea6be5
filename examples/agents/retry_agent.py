"""An agent written against the OpenAI API, trained by realrl as it is: it asks the policy an
arithmetic problem and, when the answer is wrong, says so and asks again once. The same task as
examples/envs/retry.py, written the way existing agent code is. Run it on the embedded arithmetic
task:

    python -m realrl.apps.quickstart grpo task=arith agent=examples/agents/retry_agent.py:run reward_fn=null

``client`` is an ``openai.AsyncOpenAI`` whose chat completions the policy answers; realrl records the
tokens it sampled, so the trajectory is trained on exactly those.
"""

from realrl.impl.rewards.math_answer import math_answer_reward


async def run(client, prompt: str, answer: str, **_) -> float:
    messages = [{"role": "user", "content": prompt}]
    for _ in range(2):  # the first answer and one retry
        reply = await client.chat.completions.create(model="policy", messages=messages)
        text = reply.choices[0].message.content
        if math_answer_reward([prompt], [text], answer=[answer])[0] > 0:
            return 1.0
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "=?"}]
    return 0.0
