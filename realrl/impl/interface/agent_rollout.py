"""The actor's generate call with a user's agent: ``gen.n`` agent runs per prompt.

``agent=file.py:run`` names ``async def run(client, prompt, **metadata) -> float``; each run talks to
the policy through the loopback chat endpoint (``realrl.impl.agents``) and its completions become
one trajectory, trained token-in, token-out. This module is the engine's side: a batch of the
agents' requests is one generate call, each request sampled under its own key
(``<sample id>/<answer index>/<completion index>``), so what an agent is answered does not depend on
which other requests shared its batch.

A replica of several ranks (tensor-parallel ranks, pipeline stages) runs the agents on its first
rank only: when the requests of a batch arrive depends on the agents' timing, which differs
between processes, and every rank of the replica must run the same generate calls. The first rank sends each batch to the others, which
sample it with it, and at the end the trajectories. FSDP ranks, which must also run the same
number of generate calls, are refused by ``agent_generate``: each holds its own prompts and
agents, and nothing makes their batches line up.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.distributed as dist

from realrl.api.core.data_api import MicroBatchSpec, SequenceSample
from realrl.api.core.model_api import GenerationHyperparameters, GenerationOutput, Model
from realrl.impl.agents.runner import AgentError, CompletionRequest, CompletionResult, run_agents
from realrl.impl.interface.env_rollout import PROMPT_KEY, engine_sampler
from realrl.impl.interface.trajectory import pack_trajectories, trajectory_stats


@dataclasses.dataclass(frozen=True)
class AgentOptions:
    agent: str  # module:function or file.py:function
    timeout: float = 600.0  # seconds one agent's whole run may take
    max_new_tokens: int = 256  # per completion
    max_total_tokens: int | None = None  # per trajectory, after the prompt


def agent_generate(
    model: Model,
    data: SequenceSample,
    mb_spec: MicroBatchSpec,
    gconfig: GenerationHyperparameters,
    opts: AgentOptions,
) -> tuple[GenerationOutput, torch.Tensor, dict[str, float]]:
    """(the agents' trajectories as one generation output, prompt-major; their rewards; stats)."""
    parallel = getattr(model.module, "parallel", None)
    if parallel is not None and getattr(parallel, "fsdp", False):
        raise ValueError(
            "agent=... cannot generate on FSDP-sharded ranks (each rank's agents ask for completions at "
            "their own pace, and FSDP ranks must generate in lockstep): give actor_gen a layout without "
            "FSDP, e.g. a per-call layout"
        )
    group = getattr(parallel, "replica_group", None) if parallel is not None else None
    shared = group is not None and dist.get_world_size(group) > 1
    generate = _batch_generate(model, mb_spec, gconfig)
    if shared and dist.get_rank(group) != 0:
        trajs, stats = _follow(group, generate)
    else:
        prompts = [p.tolist() for p in data.data[PROMPT_KEY].cpu().split(data.flat_seqlens(PROMPT_KEY))]
        texts = model.tokenizer.batch_decode(prompts, skip_special_tokens=True)
        rows = [{k: v[i] for k, v in data.metadata.items()} for i in range(data.bs)]
        ids = [f"{sid}/{k}" for sid in data.ids for k in range(gconfig.n)]
        lead = _lead(group, generate) if shared else generate
        try:
            trajs, stats = run_agents(
                opts.agent,
                [t for t in texts for _ in range(gconfig.n)],
                [r for r in rows for _ in range(gconfig.n)],
                model.tokenizer,
                lead,
                min(opts.max_new_tokens, gconfig.max_new_tokens),
                opts.max_total_tokens,
                opts.timeout,
                ids,
            )
        except Exception as e:
            if shared:  # the followers stop with the same error instead of waiting for a batch
                _send(group, ("error", f"{type(e).__name__}: {e}"))
            raise
        if shared:
            _send(group, ("done", (trajs, stats)))
    rewards = torch.tensor([t.reward for t in trajs], dtype=torch.float32)
    return pack_trajectories(trajs), rewards, {**trajectory_stats(trajs), **stats}


def _batch_generate(model: Model, mb_spec: MicroBatchSpec, gconfig: GenerationHyperparameters):
    """The runner's ``generate``: one engine call for a batch, each request cut to its own limit."""
    sample = engine_sampler(model, mb_spec, gconfig)

    def generate(requests: list[CompletionRequest]) -> list[CompletionResult]:
        outs = sample(
            [r.context for r in requests], [r.key for r in requests], max(r.max_new_tokens for r in requests)
        )
        results = []
        for r, o in zip(requests, outs, strict=True):
            cut = len(o.tokens) > r.max_new_tokens
            n = r.max_new_tokens
            results.append(CompletionResult(o.tokens[:n], o.logprobs[:n], o.no_eos or cut))
        return results

    return generate


def _send(group: Any, message: tuple) -> Any:
    box = [message]
    dist.broadcast_object_list(box, src=dist.get_global_rank(group, 0), group=group)
    return box[0]


def _lead(group: Any, generate):
    def lead(requests: list[CompletionRequest]) -> list[CompletionResult]:
        _send(group, ("generate", requests))
        return generate(requests)

    return lead


def _follow(group: Any, generate) -> tuple[list, dict[str, float]]:
    """A replica's other rank: sample every batch the first rank sends, until it sends the end."""
    while True:
        kind, value = _send(group, None)
        if kind == "generate":
            generate(value)
        elif kind == "error":
            raise AgentError(f"the agents failed on the replica's first rank: {value}")
        else:
            return value
