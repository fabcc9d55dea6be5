"""Agents: a user's own ``async def run(client, prompt, **metadata) -> float`` talks to an
OpenAI-compatible chat-completions endpoint served by realrl for the duration of a rollout, and every
completion it asks for becomes part of a token-in, token-out ``Trajectory`` (``runner.run_agents``).

Nothing is registered on import: the rollout that uses agents imports ``runner`` itself.
"""
