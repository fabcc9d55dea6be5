"""A multi-turn trajectory as training sees it: one token sequence, the model's tokens marked.

Environments (``multi_turn``) and agents talking to the chat endpoint (``realrl.impl.agents``)
both produce these; ``pack_trajectories`` turns them into the ``GenerationOutput`` a rollout is
made of, where every token the policy did not sample (the prompt, observations, a chat
template's headers) counts as prompt: no loss, no KL, no critic target, log-prob 0.
"""

from __future__ import annotations

import dataclasses

import torch

from realrl.api.core.model_api import GenerationOutput


@dataclasses.dataclass
class Trajectory:
    """One trajectory, token-in token-out: ``tokens[i]`` was sampled by the policy iff
    ``model_mask[i]``, with log-prob ``logprobs[i]`` (0 elsewhere)."""

    tokens: list[int]
    model_mask: list[bool]
    logprobs: list[float]
    prompt_len: int  # the first prompt's tokens
    reward: float = 0.0  # the sum of the environment's step rewards (an agent's return value)
    turns: int = 0  # the model's turns
    no_eos: bool = False  # the last turn hit a token budget before EOS
    turn_tokens: list[int] = dataclasses.field(default_factory=list)  # the model's tokens per turn
    env_seconds: float = 0.0  # time spent in the environment's steps (or the agent's own code)

    def __post_init__(self) -> None:
        if not len(self.tokens) == len(self.model_mask) == len(self.logprobs):
            raise ValueError(
                f"a trajectory's tokens ({len(self.tokens)}), model mask ({len(self.model_mask)}) and "
                f"log-probs ({len(self.logprobs)}) must have one entry per token"
            )
        if any(self.model_mask[: self.prompt_len]):
            raise ValueError("a trajectory's prompt tokens cannot be the model's")


def pack_trajectories(trajectories: list[Trajectory]) -> GenerationOutput:
    """The trajectories as one generation's output (in order): ``logprobs`` in the
    ``packed_logprobs`` alignment (entry j is token j + 1's), ``env_mask`` True on every token after
    the prompt that the model did not sample."""
    seqs, lps, env = [], [], []
    for t in trajectories:
        seqs.append(torch.tensor(t.tokens, dtype=torch.long))
        lps.append(torch.tensor(t.logprobs[1:], dtype=torch.float32))
        after_prompt = torch.arange(len(t.tokens)) >= t.prompt_len
        env.append(after_prompt & ~torch.tensor(t.model_mask, dtype=torch.bool))
    return GenerationOutput(
        sequences=torch.cat(seqs),
        seqlens=[len(t.tokens) for t in trajectories],
        prompt_lens=[t.prompt_len for t in trajectories],
        logprobs=torch.cat(lps),
        no_eos=torch.tensor([t.no_eos for t in trajectories], dtype=torch.bool),
        env_mask=torch.cat(env),
    )


def trajectory_stats(trajectories: list[Trajectory]) -> dict[str, float]:
    """What a multi-turn generate call reports of its trajectories (``actor_gen/turns_mean``, ...)."""
    n = max(1, len(trajectories))
    turns = [t.turns for t in trajectories]
    model_tokens = sum(sum(t.model_mask) for t in trajectories)
    after_prompt = sum(len(t.tokens) - t.prompt_len for t in trajectories)
    return {
        "turns_mean": sum(turns) / n,
        "turns_max": float(max(turns, default=0)),
        "tokens_per_turn": model_tokens / max(1, sum(turns)),
        "observation_tokens_mean": (after_prompt - model_tokens) / n,
        "env_reward_mean": sum(t.reward for t in trajectories) / n,
    }
