"""Held-out evaluation of the calculator task: greedy multi-turn rollouts with the environment.

The loop is the training rollout's own (``multi_turn.roll_out`` over the engine's generate, as
``env_rollout`` samples a turn), with greedy decoding and a ``CalculatorEnv`` per problem, so a
checkpoint is scored on exactly what RL optimised. Besides accuracy it says *how* the policy got
there: how often it called the tool, how many of its calls were right (well-formed and on a
sub-expression that keeps the problem's value) and how accurate it was with and without the
tool, which tells a policy that learned to use the tool from one that learned to guess.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from realrl.api.core.model_api import GenerationHyperparameters
from realrl.experiments.toy_eval import EVAL_MB, load_batch, load_for_inference
from realrl.impl.dataset.toy.calc import parse_prompt, right_calls
from realrl.impl.envs.calculator import CalculatorEnv
from realrl.impl.interface.env_rollout import engine_sampler
from realrl.impl.interface.multi_turn import TurnBudget, roll_out


@dataclasses.dataclass
class ToolUseEvaluation:
    accuracy: float
    tool_call_rate: float  # share of problems with at least one tool call (well-formed or not)
    calls_per_problem: float
    right_call_share: float  # of all tool calls: well-formed and on a right sub-expression
    malformed_call_share: float  # of all tool calls: answered "=err"
    accuracy_with_tool: float | None  # on the problems where it called the tool (None: no such problem)
    accuracy_without_tool: float | None
    no_answer_fraction: float  # trajectories that ended without a final answer
    turns_mean: float
    samples: list[dict]  # a few problems and the whole trajectory

    def figures(self, prefix: str = "") -> dict[str, Any]:
        """The figures for summary.json, each name prefixed (``sft_`` for the SFT policy)."""
        out = {f"{prefix}{k}": v for k, v in dataclasses.asdict(self).items() if k != "samples"}
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in out.items()}


def _share(num: float, den: float) -> float | None:
    return None if den == 0 else num / den


@torch.no_grad()
def evaluate_tool_use(
    policy_path: str,
    tokenizer_path: str,
    prompts_path: str,
    budget: TurnBudget,
    n_prompts: int = 800,
    seed: int = 1,
    timeout: float = 60.0,
) -> ToolUseEvaluation:
    """Greedy trajectories of the policy at ``policy_path`` on the first ``n_prompts`` held-out
    problems (``prompt`` rows with their ``answer``), each with its own ``CalculatorEnv``."""
    policy = load_for_inference(policy_path, tokenizer_path)
    tok = policy.tokenizer
    batch = load_batch(
        "prompt", {"dataset_path": prompts_path, "metadata_keys": ["answer"]}, tok, n_prompts, seed
    )
    prompts = [p.tolist() for p in batch.data["packed_prompts"].split(batch.flat_seqlens("packed_prompts"))]
    texts = tok.batch_decode(prompts, skip_special_tokens=True)
    answers = list(batch.metadata["answer"])
    envs = [CalculatorEnv(text, answer) for text, answer in zip(texts, answers, strict=True)]
    greedy = GenerationHyperparameters(max_new_tokens=budget.max_new_tokens, greedy=True)
    trajs, stats = roll_out(
        prompts,
        [str(i) for i in batch.ids],
        envs,
        tok,
        budget,
        engine_sampler(policy, EVAL_MB, greedy),
        timeout,
    )
    right = [t.reward > 0 for t in trajs]
    used = [bool(e.calls) for e in envs]
    n_calls = sum(len(e.calls) for e in envs)
    n_right = 0
    for text, env in zip(texts, envs, strict=True):
        problem = parse_prompt(text)
        if problem is not None:
            n_right += sum(right_calls(problem, [c.args for c in env.calls]))
    n = max(1, len(trajs))
    with_tool = [r for r, u in zip(right, used) if u]
    without = [r for r, u in zip(right, used) if not u]
    samples = []
    for text, t in list(zip(texts, trajs))[:5]:
        transcript = tok.decode(t.tokens[t.prompt_len :], skip_special_tokens=False)
        samples.append({"prompt": text, "trajectory": transcript, "reward": t.reward})
    return ToolUseEvaluation(
        accuracy=sum(right) / n,
        tool_call_rate=sum(used) / n,
        calls_per_problem=n_calls / n,
        right_call_share=_share(n_right, n_calls) or 0.0,
        malformed_call_share=_share(sum(not c.ok for e in envs for c in e.calls), n_calls) or 0.0,
        accuracy_with_tool=_share(sum(with_tool), len(with_tool)),
        accuracy_without_tool=_share(sum(without), len(without)),
        no_answer_fraction=sum(not e.answered for e in envs) / n,
        turns_mean=stats["turns_mean"],
        samples=samples,
    )
