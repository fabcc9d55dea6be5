"""Multi-turn rollouts: the policy and one environment per trajectory take turns.

A turn samples the model's continuation of every unfinished trajectory at once, then every
environment steps on its trajectory's new text (``env_api.step_all``). The observation's tokens
(``chat_turns.observation_ids``) are appended after the model's, and the next turn continues from
the whole trajectory's ids: the model's own tokens are never decoded and re-tokenised, so the
tokens trained on are the tokens sampled (verl's agent-loop docs explain how re-tokenising broke
their PPO runs). A trajectory ends when its environment says done, after ``max_turns`` turns, or
when its next observation or turn would pass ``max_total_tokens`` (counted after the prompt).

``roll_out`` is written against two callables, so the same loop serves a training rollout (the
actor's engine, every data-parallel rank in lockstep) and a plain evaluation loop:

- ``sample(contexts, keys, max_new_tokens)``: each context's continuation, keyed by ``keys`` (the
  sampling noise of a continuation depends on its key only); called with no context at all on a
  rank whose trajectories are done while another rank's are not (it must still take part in
  whatever collective the others' sampling runs);
- ``go_on(n_active)``: whether any rank still has unfinished trajectories.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

from realrl.api.core.chat_turns import observation_ids
from realrl.api.core.env_api import EnvStep, step_all
from realrl.impl.interface.trajectory import Trajectory, trajectory_stats


@dataclasses.dataclass(frozen=True)
class Sampled:
    """One continuation: the sampled ids (ending with EOS unless a token limit cut it)."""

    tokens: list[int]
    logprobs: list[float]
    no_eos: bool


@dataclasses.dataclass(frozen=True)
class TurnBudget:
    max_turns: int = 1
    max_new_tokens: int = 256  # per turn
    max_total_tokens: int | None = None  # per trajectory, after the prompt (model and observations)

    def __post_init__(self) -> None:
        if self.max_turns < 1:
            raise ValueError(f"ppo.max_turns must be >= 1, got {self.max_turns}")
        if self.max_total_tokens is not None and self.max_total_tokens < 1:
            raise ValueError(f"ppo.max_total_tokens must be >= 1 or None, got {self.max_total_tokens}")


SampleFn = Callable[[list[list[int]], list[str], int], list[Sampled]]
StepFn = Callable[[list[Any], list[str], list[Any]], list[EnvStep]]


def roll_out(
    prompts: Sequence[list[int]],
    keys: Sequence[str],
    envs: Sequence[Any],
    tokenizer: Any,
    budget: TurnBudget,
    sample: SampleFn,
    timeout: float,
    go_on: Callable[[int], bool] = bool,
    step: StepFn | None = None,
) -> tuple[list[Trajectory], dict[str, float]]:
    """Every trajectory to its end; ``keys[i]`` names trajectory i (errors name it too, and turn
    ``t``'s sampling key is ``f"{keys[i]}/turn{t}"``). ``step`` replaces ``step_all(envs, texts,
    keys, timeout)`` (a replica of several ranks steps the environments on one rank and shares
    the results). Returns the trajectories and the call's statistics."""
    step = step or (lambda e, texts, names: step_all(e, texts, names, timeout))
    trajs = [
        Trajectory(tokens=list(p), model_mask=[False] * len(p), logprobs=[0.0] * len(p), prompt_len=len(p))
        for p in prompts
    ]
    active = list(range(len(trajs)))
    stats = {"turn_seconds": 0.0, "env_seconds": 0.0, "cut_by_budget": 0.0}
    turn = 0
    while go_on(len(active)):
        turn += 1
        limits = [_turn_limit(trajs[i], budget) for i in active]
        started = time.perf_counter()
        outs = sample(
            [trajs[i].tokens for i in active],
            [f"{keys[i]}/turn{turn}" for i in active],
            max(limits, default=1),
        )
        stats["turn_seconds"] += time.perf_counter() - started
        for i, out, limit in zip(active, outs, limits, strict=True):
            _append_turn(trajs[i], out, limit)
        started = time.perf_counter()
        texts = [_turn_text(tokenizer, trajs[i]) for i in active]
        steps = step([envs[i] for i in active], texts, [keys[i] for i in active])
        stats["env_seconds"] += time.perf_counter() - started
        still = []
        for i, s in zip(active, steps, strict=True):
            t = trajs[i]
            t.reward += s.reward
            if s.done or t.turns >= budget.max_turns:
                continue
            obs = observation_ids(tokenizer, s.observation) if s.observation else []
            if budget.max_total_tokens is not None and _used(t) + len(obs) + 1 > budget.max_total_tokens:
                stats["cut_by_budget"] += 1  # no room for the observation and one more token
                continue
            t.tokens += obs
            t.model_mask += [False] * len(obs)
            t.logprobs += [0.0] * len(obs)
            still.append(i)
        active = still
    return trajs, _summary(trajs, stats, turn)


def _used(t: Trajectory) -> int:
    return len(t.tokens) - t.prompt_len


def _turn_limit(t: Trajectory, budget: TurnBudget) -> int:
    if budget.max_total_tokens is None:
        return budget.max_new_tokens
    return max(1, min(budget.max_new_tokens, budget.max_total_tokens - _used(t)))


def _append_turn(t: Trajectory, out: Sampled, limit: int) -> None:
    """The model's turn, cut to this trajectory's limit (the batch sampled up to the largest)."""
    tokens, logprobs, no_eos = out.tokens, out.logprobs, out.no_eos
    if len(tokens) > limit:
        tokens, logprobs, no_eos = tokens[:limit], logprobs[:limit], True
    t.tokens += tokens
    t.model_mask += [True] * len(tokens)
    t.logprobs += [float(x) for x in logprobs]
    t.turns += 1
    t.turn_tokens.append(len(tokens))
    t.no_eos = no_eos


def _turn_text(tokenizer: Any, t: Trajectory) -> str:
    """The model's last turn as text (what its environment reads), without special tokens."""
    n = t.turn_tokens[-1]
    return tokenizer.decode(t.tokens[len(t.tokens) - n :], skip_special_tokens=True)


def _summary(trajs: list[Trajectory], stats: dict[str, float], turns_run: int) -> dict[str, float]:
    n = max(1, len(trajs))
    return {
        **trajectory_stats(trajs),
        "env_seconds": stats["env_seconds"],
        # the model's share of the call: seconds per turn of the whole batch
        "seconds_per_turn": stats["turn_seconds"] / max(1, turns_run),
        "cut_by_budget_frac": stats["cut_by_budget"] / n,
    }
