"""The actor's generate call with environments: ``gen.n`` trajectories per prompt, multi-turn.

``EnvOptions`` are the experiment's ``env``, ``env_kwargs``, ``env_timeout`` and the turn budget
(``ppo.max_turns``, ``ppo.gen.max_new_tokens`` per turn, ``ppo.max_total_tokens``). Each
trajectory gets its own environment, ``Env(prompt_text, **metadata, **env_kwargs)``; the loop
itself is ``multi_turn.roll_out``. What this module adds is the engine's side of it:

- every turn is one generate call of the engine over the unfinished trajectories, each its own
  sample keyed ``<sample id>/<answer index>/turn<t>``, so a trajectory's tokens do not depend on
  the layout or on how many other trajectories are still running;
- data-parallel ranks under FSDP turn in lockstep (a rank that is done joins the others'
  weight gathers until every rank is done);
- the ranks of a replica (tensor-parallel ranks, pipeline stages) hold the same trajectories: the
  replica's first rank steps the environments and sends the results to the others, so an environment that is not
  deterministic (a clock, a live tool) cannot make the ranks' trajectories differ, and a user's
  tool is called once per step, not once per rank.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.distributed as dist

from realrl.api.core.data_api import MicroBatchSpec, SequenceSample
from realrl.api.core.env_api import EnvError, EnvStep, make_env, resolve_env, step_all
from realrl.api.core.model_api import GenerationHyperparameters, GenerationOutput, Model
from realrl.impl.interface.multi_turn import Sampled, TurnBudget, roll_out
from realrl.impl.interface.trajectory import pack_trajectories

PROMPT_KEY = "packed_prompts"


@dataclasses.dataclass(frozen=True)
class EnvOptions:
    env: str
    env_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    env_timeout: float = 60.0  # seconds one step of one environment may take
    budget: TurnBudget = dataclasses.field(default_factory=TurnBudget)


def env_generate(
    model: Model,
    data: SequenceSample,
    mb_spec: MicroBatchSpec,
    gconfig: GenerationHyperparameters,
    opts: EnvOptions,
) -> tuple[GenerationOutput, torch.Tensor, dict[str, float]]:
    """(the trajectories as one generation output, prompt-major; each trajectory's summed step
    reward; the call's statistics)."""
    cls = resolve_env(opts.env)
    tokenizer = model.tokenizer
    prompts = [p.tolist() for p in data.data[PROMPT_KEY].cpu().split(data.flat_seqlens(PROMPT_KEY))]
    texts = tokenizer.batch_decode(prompts, skip_special_tokens=True)
    contexts, keys, envs = [], [], []
    for i, (sid, prompt, text) in enumerate(zip(data.ids, prompts, texts, strict=True)):
        metadata = {k: v[i] for k, v in data.metadata.items()}
        for k in range(gconfig.n):
            key = f"{sid}/{k}"
            contexts.append(prompt)
            keys.append(key)
            envs.append(make_env(cls, text, metadata, opts.env_kwargs, key))
    trajs, stats = roll_out(
        contexts,
        keys,
        envs,
        tokenizer,
        opts.budget,
        engine_sampler(model, mb_spec, gconfig),
        opts.env_timeout,
        go_on=lambda n: model.module.lockstep_count(n) > 0,
        step=replica_step(model, opts.env_timeout),
    )
    rewards = torch.tensor([t.reward for t in trajs], dtype=torch.float32)
    return pack_trajectories(trajs), rewards, stats


def engine_sampler(model: Model, mb_spec: MicroBatchSpec, gconfig: GenerationHyperparameters):
    """One turn: the engine continues each context by at most ``max_new_tokens`` tokens."""

    def sample(contexts: list[list[int]], keys: list[str], max_new_tokens: int) -> list[Sampled]:
        if not contexts:
            model.module.join_generation()
            return []
        batch = SequenceSample.from_default(
            ids=keys,
            seqlens=[len(c) for c in contexts],
            data={PROMPT_KEY: torch.tensor([t for c in contexts for t in c], dtype=torch.long)},
        ).to(model.device)
        turn = dataclasses.replace(
            gconfig,
            n=1,
            max_new_tokens=max_new_tokens,
            min_new_tokens=min(gconfig.min_new_tokens, max_new_tokens),
        )
        gen = model.module.generate(batch, mb_spec, model.tokenizer, turn)
        seqs = gen.sequences.cpu().split(gen.seqlens)
        lps = gen.logprobs.float().cpu().split([n - 1 for n in gen.seqlens])
        return [
            Sampled(s[p:].tolist(), lp[p - 1 :].tolist(), bool(e))
            for s, lp, p, e in zip(seqs, lps, gen.prompt_lens, gen.no_eos.cpu().tolist(), strict=True)
        ]

    return sample


def replica_step(model: Model, timeout: float):
    """``step_all`` on the replica's first rank, its results (or its error) sent to the replica's
    other ranks (tensor-parallel ranks and pipeline stages, which all generate the next turn);
    plain ``step_all`` for a replica of one rank."""
    parallel = getattr(model.module, "parallel", None)
    group = getattr(parallel, "replica_group", None) if parallel is not None else None
    if group is None or dist.get_world_size(group) == 1:
        return lambda envs, texts, keys: step_all(envs, texts, keys, timeout)

    def step(envs: list[Any], texts: list[str], keys: list[Any]) -> list[EnvStep]:
        box: list[Any] = [None]
        if dist.get_rank(group) == 0:
            try:
                box[0] = ("ok", step_all(envs, texts, keys, timeout))
            except EnvError as e:
                box[0] = ("error", str(e))
        dist.broadcast_object_list(box, src=dist.get_global_rank(group, 0), group=group)
        status, value = box[0]
        if status == "error":
            raise EnvError(value)
        return value

    return step
