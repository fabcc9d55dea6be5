"""A reward function and an agent that import: a misspelled name of theirs is named with the closest."""


def score(prompts, completions, **metadata):
    return [0.0 for _ in completions]


async def run(client, prompt, **metadata):
    return None
