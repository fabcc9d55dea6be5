"""The embedded tool-use task: multi-step arithmetic with a calculator environment (``env=calc``).

SFT learns whole trajectories of a teacher that uses the tool imperfectly (it skips the tool on
some problems, ignores precedence on others, miscopies results; ``realrl.impl.dataset.toy.calc``),
the tool's turns masked out of the loss. GRPO then takes multi-turn rollouts with the calculator,
rewarded 1 for a right final answer, and raises the held-out accuracy. The summary reports,
greedy and multi-turn with the environment, the accuracy before (the SFT policy) and after RL
and how each used the tool (``calc_eval``).
"""

from __future__ import annotations

from typing import Any

from realrl.experiments.tasks.base import (
    answer_rl_preset,
    answer_sft_preset,
    before_after,
    register_answer_task,
    rl_recipe,
)
from realrl.impl.dataset.toy.calc import CalcTaskConfig, build_calc_task, calc_model_config, calc_paths

MAX_TURNS = 4  # three calls (three operations) and the answer
MAX_NEW_TOKENS = 12  # per turn: "calc", two four-digit operands, an operator, EOS (and a spare)
MAX_TOTAL_TOKENS = 64  # after the prompt: a three-operation trajectory is at most ~58
SFT_PRESET = answer_sft_preset(epochs=4, max_seqlen=96)
RL_PRESET = answer_rl_preset(
    80,
    MAX_NEW_TOKENS,
    rollout=("env=calc", f"ppo.max_turns={MAX_TURNS}", f"ppo.max_total_tokens={MAX_TOTAL_TOKENS}"),
)


def tool_use_before_after(cfg: Any) -> dict[str, Any]:
    """Held-out accuracy and tool use of the SFT policy (``sft_*``) and of the policy after RL:
    greedy, multi-turn with the calculator, under the run's turn budget."""
    from realrl.experiments.tasks.calc_eval import evaluate_tool_use
    from realrl.impl.interface.multi_turn import TurnBudget

    run = before_after(CALC, cfg)
    budget = TurnBudget(cfg.ppo.max_turns, cfg.ppo.gen.max_new_tokens, cfg.ppo.max_total_tokens)
    common = dict(n_prompts=cfg.toy_eval_prompts, seed=cfg.seed, timeout=cfg.env_timeout)
    tok, valid = run.files["tokenizer"], run.files["rl_valid"]
    before = evaluate_tool_use(run.before, tok, valid, budget, **common)
    after = evaluate_tool_use(run.after, tok, valid, budget, **common)
    return {
        **before.figures("sft_"),
        **after.figures(),
        "accuracy_gain_points": round(100 * (after.accuracy - before.accuracy), 2),
        "samples": after.samples,
    }


CALC = register_answer_task(
    "calc",
    "multi-step arithmetic solved with a calculator tool (multi-turn, env=calc)",
    build_calc_task,
    CalcTaskConfig,
    calc_paths,
    calc_model_config,
    SFT_PRESET,
    rl_recipe(RL_PRESET, tool_use_before_after),
)
