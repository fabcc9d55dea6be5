"""A plugin whose import raises on line 4: the command line names the file, the line and the error."""

SCALE = 2
OFFSET = SCALE * undefined_constant  # noqa: F821


def score(prompts, completions, **metadata):
    return [0.0 for _ in completions]
