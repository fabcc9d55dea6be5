"""Run a user's agents against the chat endpoint and turn what they did into trajectories.

An agent is ``async def run(client, prompt: str, **metadata) -> float``: ``client`` is an
``openai.AsyncOpenAI`` pointed at the endpoint, the agent calls ``client.chat.completions.create``
as often as it likes (its tools are its own code) and returns the trajectory's reward.

Batching. All agents run as coroutines on the endpoint's event loop (a background thread); the
policy runs on the caller's thread. ``run_agents`` waits until every unfinished agent is blocked on
a completion, then calls ``generate`` once with every pending request and hands each result back to
its waiting request: as many completions per policy call as the agents allow. (An agent with
several requests in flight at once counts as blocked as soon as one of them waits.)

Token-in, token-out: each completion continues the ids the model sampled before, not a re-encoding
of its text (``token_context``).

A trajectory is the last completion's context plus its sampled ids; every earlier completion whose
context and ids are a prefix of it is one of its model turns, kept verbatim with its log-probs.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import io
import math
import numbers
import secrets
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from realrl.base.plugins import load_attribute
from realrl.impl.agents.endpoint import ChatReply, ChatRequest, EndpointServer, RequestError
from realrl.impl.agents.local_client import client_factory
from realrl.impl.agents.token_context import Completion, chained_context, render_messages
from realrl.impl.interface.trajectory import Trajectory

POLL_SECONDS = 1.0  # the longest the caller's thread sleeps between checks of its deadline
TIMEOUT_GRACE = 5.0  # beyond an agent's timeout, for a loop that some agent blocks outright


class AgentError(RuntimeError):
    """An agent failed: it raised, returned no finite reward, ran past its timeout or never asked
    for a completion. The message names the agent and the sample, with the agent's traceback."""


@dataclasses.dataclass
class CompletionRequest:
    context: list[int]  # the full token ids the model continues (prompt of this completion)
    max_new_tokens: int
    key: str  # a stable id of this request: f"{sample_id}/{completion_index}"


@dataclasses.dataclass
class CompletionResult:
    tokens: list[int]  # the sampled ids (ending with EOS unless the budget cut it)
    logprobs: list[float]  # one per sampled token
    no_eos: bool


# called on the caller's (main) thread with every request that is pending at once; returns results in order
GenerateFn = Callable[[list[CompletionRequest]], list[CompletionResult]]


@dataclasses.dataclass
class _Agent:
    index: int
    sample_id: Any
    prompt: str
    metadata: dict[str, Any]
    completions: list[Completion] = dataclasses.field(default_factory=list)
    issued: int = 0  # completion requests numbered so far (their keys)
    blocked: int = 0  # requests waiting for the policy (guarded by the session's lock)
    done: bool = False  # (guarded by the session's lock)
    error: str | None = None
    exhausted: bool = False  # its last request was refused for max_total_tokens
    reward: float = 0.0
    seconds: float = 0.0
    wait_seconds: float = 0.0


@dataclasses.dataclass
class _Pending:
    agent: _Agent
    request: CompletionRequest
    future: asyncio.Future


def _check_reward(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"an agent must return its reward as a real number, got {type(value).__name__} {value!r}"
        )
    reward = float(value)
    if not math.isfinite(reward):
        raise ValueError(f"an agent must return a finite reward, got {reward}")
    return reward


def _import_openai() -> Any:
    try:
        import openai
    except ImportError as e:
        raise ImportError("agents talk to the endpoint through the OpenAI client: pip install openai") from e
    return openai


class _Session:
    """One ``run_agents`` call: the agents' state, shared by the endpoint's loop and the caller's thread."""

    def __init__(
        self,
        agent_fn: Callable,
        spec: str,
        agents: list[_Agent],
        tokenizer: Any,
        max_new_tokens: int,
        max_total_tokens: int | None,
        timeout: float,
    ):
        self.agent_fn = agent_fn
        self.spec = spec
        self.agents = agents
        self.tokenizer = tokenizer
        self.max_new_tokens = max_new_tokens
        self.max_total_tokens = max_total_tokens
        self.timeout = timeout
        self.cond = threading.Condition()
        self.pending: list[_Pending] = []  # guarded by cond
        self.unsettled = len(agents)  # agents neither done nor blocked (guarded by cond)
        self.failed = False  # some agent is done with an error (guarded by cond)
        self.live: set[asyncio.Future] = set()  # futures of requests not yet answered (loop thread only)
        self.closed = False
        self.generate_calls = 0
        self.generate_seconds = 0.0  # in generate: the policy's share of the rollout

    # ---- shared by the endpoint's loop and the caller's thread ----

    def _block(self, agent: _Agent, change: int) -> None:
        """Under ``cond``: ``agent.blocked += change``, counting the agents neither done nor blocked;
        the caller's thread is woken only when that count reaches 0 (a wake-up per request would
        cost a thread switch and a scan of every agent each time)."""
        before = agent.done or agent.blocked > 0
        agent.blocked += change
        after = agent.done or agent.blocked > 0
        self.unsettled += int(before) - int(after)
        if self.unsettled == 0:
            self.cond.notify_all()

    def _finish(self, agent: _Agent, error: str | None) -> None:
        """The agent's run is over: the caller's thread is woken if that settles the batch or failed."""
        with self.cond:
            if agent.blocked == 0:
                self.unsettled -= 1
            agent.error = error
            agent.done = True
            self.failed = self.failed or error is not None
            if self.unsettled == 0 or error is not None:
                self.cond.notify_all()

    # ---- on the endpoint's loop ----

    async def complete(self, agent: _Agent, chat: ChatRequest) -> ChatReply:
        """The endpoint's handler: queue one completion for the caller's thread and wait for it."""
        rendering = render_messages(self.tokenizer, chat.messages, chat.tools, generation_prompt=True)
        context = chained_context(self.tokenizer, agent.completions, chat.messages, chat.tools, rendering)
        budget = self.max_new_tokens if chat.max_tokens is None else min(self.max_new_tokens, chat.max_tokens)
        if self.max_total_tokens is not None:
            left = self.max_total_tokens - len(context)
            if left <= 0:
                agent.exhausted = True
                raise RequestError(
                    f"the conversation is {len(context)} tokens long: nothing is left under this "
                    f"trajectory's limit of {self.max_total_tokens} tokens (max_total_tokens)"
                )
            budget = min(budget, left)
        # the sample id and the completion's index only: the same wherever the agent runs
        key = f"{agent.sample_id}/{agent.issued}"
        agent.issued += 1
        future = asyncio.get_running_loop().create_future()
        pending = _Pending(agent, CompletionRequest(context, budget, key), future)
        with self.cond:
            if self.closed:
                raise RequestError("the rollout is over", status=503)
            self.pending.append(pending)
            self._block(agent, 1)
            self.live.add(future)
        start = time.monotonic()
        try:
            result: CompletionResult = await future
        finally:
            agent.wait_seconds += time.monotonic() - start
            self.live.discard(future)
            with self.cond:
                if pending in self.pending:  # cancelled before the caller's thread took it
                    self.pending.remove(pending)
                    self._block(agent, -1)
        agent.exhausted = False
        tokens = list(result.tokens)
        content = tokens if result.no_eos or not tokens else tokens[:-1]
        text = self.tokenizer.decode(content, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        agent.completions.append(
            Completion(chat.messages, rendering, context, tokens, list(result.logprobs), result.no_eos, text)
        )
        token_texts = (
            [self.tokenizer.decode([t], skip_special_tokens=False) for t in tokens] if chat.logprobs else []
        )
        return ChatReply(text, tokens, token_texts, list(result.logprobs), len(context), result.no_eos)

    def deliver(self, batch: list[_Pending], results: list[CompletionResult]) -> None:
        for p, r in zip(batch, results):
            if not p.future.done():
                p.future.set_result(r)

    def close_requests(self) -> None:
        """Answer every request still waiting with 503, so the server can stop."""
        with self.cond:
            self.closed = True
        for future in list(self.live):
            if not future.done():
                future.set_exception(RequestError("the rollout is over", status=503))

    async def run_agent(self, agent: _Agent, make_client: Callable[[str], Any], api_key: str) -> None:
        start = time.monotonic()
        error = None
        client: Any = None
        task: asyncio.Future | None = None
        try:
            client = make_client(api_key)
            coro = self.agent_fn(client, agent.prompt, **agent.metadata)
            if not inspect.isawaitable(coro):
                raise TypeError(
                    f"an agent must be an async function (async def run(client, prompt, **metadata)), got {coro!r}"
                )
            task = asyncio.ensure_future(coro)
            done, _ = await asyncio.wait({task}, timeout=self.timeout)
            if not done:
                where = io.StringIO()
                task.print_stack(file=where)
                error = (
                    f"the agent ran past its timeout of {self.timeout:g} s; it was at:\n{where.getvalue()}"
                )
            else:
                agent.reward = _check_reward(task.result())
        except asyncio.CancelledError:
            error = "cancelled: the rollout stopped"
            raise
        except BaseException:  # noqa: BLE001 - the caller's thread raises it as AgentError
            error = traceback.format_exc()
        finally:
            agent.seconds = time.monotonic() - start
            if task is not None and not task.done():
                task.cancel()
                await asyncio.wait({task}, timeout=1.0)
            try:
                if client is not None:
                    await client.close()
            except BaseException:  # noqa: BLE001 - closing a client must not hide the agent's outcome
                pass
            self._finish(agent, error)

    # ---- on the caller's thread ----

    def _settled(self) -> bool:
        return self.unsettled == 0

    def _raise_failed(self) -> None:
        for a in self.agents:
            if a.done and a.error is not None:
                raise AgentError(
                    f"agent {self.spec} failed on sample {a.sample_id!r} (agent {a.index}): {a.error}"
                )

    def drive(self, server: EndpointServer, generate: GenerateFn) -> None:
        """Batch the agents' requests into ``generate`` calls until every agent is done."""
        deadline = time.monotonic() + self.timeout + TIMEOUT_GRACE
        while True:
            with self.cond:
                self.cond.wait_for(
                    lambda: self._settled() or self.failed,
                    timeout=max(0.0, min(POLL_SECONDS, deadline - time.monotonic())),
                )
                self._raise_failed()
                if all(a.done for a in self.agents):
                    return
                if not self._settled():
                    if time.monotonic() >= deadline:
                        late = [a.sample_id for a in self.agents if not a.done]
                        raise AgentError(
                            f"agent {self.spec} ran past its timeout of {self.timeout:g} s on samples {late!r} "
                            "without yielding to the event loop (does it call blocking code, e.g. time.sleep, "
                            "instead of awaiting?)"
                        )
                    continue
                batch, self.pending = self.pending, []
            started = time.perf_counter()
            results = generate([p.request for p in batch])
            self.generate_seconds += time.perf_counter() - started
            self.generate_calls += 1
            if len(results) != len(batch):
                raise ValueError(f"generate returned {len(results)} results for {len(batch)} requests")
            for p, r in zip(batch, results):
                if len(r.tokens) != len(r.logprobs) or len(r.tokens) > p.request.max_new_tokens:
                    raise ValueError(
                        f"generate's result for {p.request.key} has {len(r.tokens)} tokens and {len(r.logprobs)} "
                        f"log-probs (at most {p.request.max_new_tokens} tokens, one log-prob each)"
                    )
            with self.cond:
                for p in batch:
                    self._block(p.agent, -1)
            server.call_soon(self.deliver, batch, results)

    def trajectory(self, agent: _Agent) -> tuple[Trajectory, int]:
        """The agent's trajectory and how many of its completions are not on it."""
        if not agent.completions:
            raise AgentError(
                f"agent {self.spec} made no chat completion on sample {agent.sample_id!r} (agent {agent.index}): "
                "a trajectory needs at least one model turn"
            )
        last = agent.completions[-1]
        tokens = last.context + last.tokens
        mask = [False] * len(tokens)
        logprobs = [0.0] * len(tokens)
        chain: list[Completion] = []
        bound = len(tokens)  # the earliest position a later turn of the chain claims
        for c in reversed(agent.completions):
            start, end = len(c.context), len(c.context) + len(c.tokens)
            if end <= bound and tokens[:start] == c.context and tokens[start:end] == c.tokens:
                mask[start:end] = [True] * (end - start)
                logprobs[start:end] = c.logprobs
                chain.append(c)
                bound = start
        chain.reverse()
        trajectory = Trajectory(
            tokens=tokens,
            model_mask=mask,
            logprobs=logprobs,
            prompt_len=len(chain[0].context),
            reward=agent.reward,
            turns=len(chain),
            no_eos=last.no_eos or agent.exhausted,
            turn_tokens=[len(c.tokens) for c in chain],
            env_seconds=max(0.0, agent.seconds - agent.wait_seconds),
        )
        return trajectory, len(agent.completions) - len(chain)


def run_agents(
    agent: Callable | str,
    prompts: list[str],
    metadata: list[dict],
    tokenizer: Any,
    generate: GenerateFn,
    max_new_tokens: int,
    max_total_tokens: int | None,
    timeout: float,
    sample_ids: list,
) -> tuple[list[Trajectory], dict[str, float]]:
    """Run ``agent`` once per prompt (``agent(client, prompt, **metadata[i])``), all concurrently,
    answering their chat completions with ``generate`` on this thread; one trajectory per prompt,
    in order, and the stats ``agent/completions_mean``, ``agent/unchained_completions`` (the
    completions left out of the trajectories), ``agent/seconds`` (mean wall time of an agent),
    ``agent/generate_calls`` and ``agent/generate_seconds`` (the time in them).

    ``agent`` is the function or a ``module:name`` / ``file.py:name`` spec. A completion gets at most
    ``max_new_tokens`` (less if the request's ``max_tokens`` says so, or if fewer are left under
    ``max_total_tokens`` for the trajectory); ``timeout`` bounds each agent's whole run, its waits
    on completions included. Raises AgentError when an agent fails; the endpoint is shut down on
    every path.
    """
    spec = agent if isinstance(agent, str) else getattr(agent, "__qualname__", repr(agent))
    agent_fn = load_attribute(agent) if isinstance(agent, str) else agent
    if not callable(agent_fn):
        raise TypeError(f"agent {spec} is not callable")
    if not len(prompts) == len(metadata) == len(sample_ids):
        raise ValueError(
            f"run_agents needs one metadata dict and one sample id per prompt, got {len(prompts)} prompts, "
            f"{len(metadata)} metadata and {len(sample_ids)} sample ids"
        )
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be positive, got {max_new_tokens}")
    _import_openai()
    agents = [
        _Agent(index=i, sample_id=sid, prompt=p, metadata=dict(m))
        for i, (p, m, sid) in enumerate(zip(prompts, metadata, sample_ids))
    ]
    if not agents:
        return [], {}
    session = _Session(agent_fn, spec, agents, tokenizer, max_new_tokens, max_total_tokens, timeout)
    keys = {secrets.token_urlsafe(32): a for a in agents}
    with EndpointServer(session.complete, keys) as server:
        try:
            make_client = client_factory(_import_openai(), server, timeout)
            for key, a in keys.items():
                server.spawn(session.run_agent(a, make_client, key))
            session.drive(server, generate)
        finally:
            try:
                server.call_soon(session.close_requests)
            except RuntimeError:  # the server's loop is already closed
                pass
    built = [session.trajectory(a) for a in agents]
    stats = {
        "agent/completions_mean": sum(len(a.completions) for a in agents) / len(agents),
        "agent/unchained_completions": float(sum(n for _, n in built)),
        "agent/seconds": sum(a.seconds for a in agents) / len(agents),
        "agent/generate_calls": float(session.generate_calls),
        "agent/generate_seconds": session.generate_seconds,
    }
    return [t for t, _ in built], stats
