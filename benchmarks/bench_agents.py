"""An agent against an environment, per step: the same task both ways through the actor's own
generate calls, in this process. The embedded arithmetic task's prompts; the model answers, and
when the answer is wrong it is told so ("=?") and answers once more:

  env     ``examples/envs/retry.py:Retry`` with ``ppo.max_turns=2`` (``env_rollout.env_generate``)
  agent   ``examples/agents/retry_agent.py:run``, an OpenAI-client agent (``agent_rollout.agent_generate``:
          the loopback chat endpoint, one ``openai.AsyncOpenAI`` per trajectory)

Both run on the arithmetic task's tiny decoder (random weights unless ``--model`` names a checkpoint,
e.g. the task's SFT policy under a quickstart fileroot), one torch thread as quickstart runs it, at
its RL batch by default (32 prompts, 8 answers each, at most 5 tokens a turn). Reported per step:
seconds of each generate call (what a run's ``actor_gen`` times), the mean turns a trajectory took,
and agent / env, side by side; the two alternate, so a busy machine slows both alike.

    python benchmarks/bench_agents.py [--prompts 32] [--n 8] [--steps 3] [--model DIR]
    python benchmarks/bench_agents.py --smoke    # 2 prompts, 2 answers each, 1 step: seconds
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time

import torch
from _smoke import parse_args

import realrl.impl.builtin  # noqa: F401  (the datasets and the model factory, by name)
from realrl.api.core.config import ModelAbstraction
from realrl.api.core.data_api import MicroBatchSpec
from realrl.api.core.model_api import GenerationHyperparameters, make_backend, make_model
from realrl.experiments.tasks.arith import MAX_NEW_TOKENS
from realrl.experiments.toy_eval import load_batch
from realrl.impl.agents.local_client import http_library
from realrl.impl.dataset.toy.arith import arith_model_config, build_arith_task
from realrl.impl.interface.agent_rollout import AgentOptions, agent_generate
from realrl.impl.interface.env_rollout import EnvOptions, env_generate
from realrl.impl.interface.multi_turn import TurnBudget

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = os.path.join(REPO, "examples", "envs", "retry.py") + ":Retry"
AGENT = os.path.join(REPO, "examples", "agents", "retry_agent.py") + ":run"


def build(fileroot: str, model_path: str | None, n_prompts: int):
    """(the policy, ready to generate; a batch of the task's RL prompts with their answers)."""
    paths = build_arith_task(os.path.join(fileroot, "arith_task"))
    args: dict = {"tokenizer_path": paths["tokenizer"]}
    args.update({"path": model_path} if model_path else {"config": arith_model_config()})
    model = make_backend("inference").initialize(
        make_model(ModelAbstraction("real_model", args), "actor"), None
    )
    data = load_batch(
        "prompt", {"dataset_path": paths["rl_train"], "metadata_keys": ["answer"]}, model.tokenizer, n_prompts
    )
    return model, data


# the figures of one generate call: wall seconds, CPU seconds (every thread), seconds in the policy
COLUMNS = ("s", "CPU s", "policy s")


def measure(run) -> dict[str, float]:
    """``run()``'s figures, named as COLUMNS; its mean turns, generate calls and completions a trajectory."""
    start, cpu = time.perf_counter(), time.process_time()
    _, _, stats = run()
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    if "agent/generate_seconds" in stats:
        policy, calls = stats["agent/generate_seconds"], stats["agent/generate_calls"]
    else:  # the environment's rollout: one generate call a turn
        policy, calls = stats["seconds_per_turn"] * stats["turns_max"], stats["turns_max"]
    completions = stats.get("agent/completions_mean", 0.0)
    return {
        "s": wall,
        "CPU s": cpu,
        "policy s": policy,
        "turns": stats["turns_mean"],
        "calls": calls,
        "completions": completions,
    }


def client_cpu_per_request(messages: list[dict], n: int = 100) -> float:
    """CPU seconds of one ``chat.completions.create`` of the OpenAI client alone, its requests
    answered from memory with a fixed reply: what any agent pays a completion, whatever serves it."""
    import openai

    http = http_library(openai)
    reply = {
        "id": "chatcmpl-0",
        "object": "chat.completion",
        "created": 0,
        "model": "policy",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "####5"}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 8, "completion_tokens": 3, "total_tokens": 11},
    }
    transport = http.MockTransport(lambda request: http.Response(200, json=reply))
    client = openai.AsyncOpenAI(
        base_url="http://127.0.0.1:1/v1", api_key="k", http_client=http.AsyncClient(transport=transport)
    )

    async def run() -> float:
        for _ in range(5):  # the client's first request finds the platform, once
            await client.chat.completions.create(model="policy", messages=messages)
        start = time.process_time()
        for _ in range(n):
            await client.chat.completions.create(model="policy", messages=messages)
        return (time.process_time() - start) / n

    return asyncio.run(run())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=32, help="prompts a step (the arith RL batch)")
    ap.add_argument("--n", type=int, default=8, help="answers (trajectories) a prompt")
    ap.add_argument("--steps", type=int, default=3, help="timed steps of each, after one untimed")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (quickstart's arith runs use 1)")
    ap.add_argument("--model", default=None, help="an HF checkpoint folder (default: random weights)")
    ap.add_argument(
        "--fileroot", default=None, help="where the task's files go (default: a temporary folder)"
    )
    args = parse_args(ap, argv, prompts=2, n=2, steps=1)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        model, data = build(args.fileroot or tmp, args.model, args.prompts)
        gconfig = GenerationHyperparameters(n=args.n, max_new_tokens=MAX_NEW_TOKENS, top_p=1.0, top_k=0)
        env = EnvOptions(ENV, budget=TurnBudget(2, MAX_NEW_TOKENS))
        runs = {
            "env": lambda: env_generate(model, data, MicroBatchSpec(), gconfig, env),
            "agent": lambda: agent_generate(model, data, MicroBatchSpec(), gconfig, AgentOptions(AGENT)),
        }
        steps: dict[str, list[dict[str, float]]] = {k: [] for k in runs}
        for step in range(args.steps + 1):  # step 0 warms both up and is not reported
            for name, run in runs.items():
                torch.manual_seed(step)
                steps[name].append(measure(run))
    print(
        f"{args.prompts} prompts x {args.n} answers = {args.prompts * args.n} trajectories a step, "
        f"{args.threads} torch thread(s), {'checkpoint ' + args.model if args.model else 'random weights'}"
    )
    report({k: v[1:] for k, v in steps.items()}, args.prompts * args.n)


def report(steps: dict[str, list[dict[str, float]]], trajectories: int) -> None:
    """One row a step and one of the means: each column's env, agent and agent / env."""
    header = [f"{c} {k}" for c in COLUMNS for k in ("env", "agent", "agent / env")]
    print(f"| step | {' | '.join(header)} | turns env | turns agent |")
    print("|---" * (3 + len(header)) + "|")
    mean = {k: {c: statistics.mean(r[c] for r in v) for c in v[0]} for k, v in steps.items()}
    rows = [(str(i + 1), e, a) for i, (e, a) in enumerate(zip(steps["env"], steps["agent"]))]
    for label, e, a in [*rows, ("mean", mean["env"], mean["agent"])]:
        cells = [f"{e[c]:.3f} | {a[c]:.3f} | {a[c] / e[c]:.2f}x" for c in COLUMNS]
        print(f"| {label} | {' | '.join(cells)} | {e['turns']:.2f} | {a['turns']:.2f} |")
    e, a = mean["env"], mean["agent"]
    print(f"agent generate calls a step: {a['calls']:.1f}")
    # the floor: the environment's work plus the OpenAI client's own, completion by completion
    asks = a["completions"] * trajectories
    turn = [{"role": "user", "content": "12+34=?"}]
    retry = [*turn, {"role": "assistant", "content": "####45"}, {"role": "user", "content": "=?"}]
    client = statistics.mean(client_cpu_per_request(m) for m in (turn, retry))
    print(
        f"the OpenAI client alone: {client * 1000:.2f} ms CPU a completion x {asks:.0f} = {client * asks:.3f} s CPU "
        f"a step; with the environment's {e['CPU s']:.3f} s, a floor of "
        f"{(e['CPU s'] + client * asks) / e['CPU s']:.2f}x CPU"
    )
    print(
        f"agent / env per step: {a['s'] / e['s']:.2f}x wall ({a['s']:.3f} s against {e['s']:.3f} s), "
        f"{a['CPU s'] / e['CPU s']:.2f}x CPU"
    )


if __name__ == "__main__":
    main()
