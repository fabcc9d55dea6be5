"""The agent endpoint: a user's OpenAI-client agent becomes a token-in, token-out trajectory.

The tokenizer is a tiny byte-level BPE with a ChatML template, built offline. The fake policy
answers with one token per character: a tokenisation the BPE would never produce (it merges), so a
trajectory that decoded and re-encoded the model's turns would not hold the sampled ids.
"""

from __future__ import annotations

import asyncio
import math
import socket
import threading

import pytest
import torch

from realrl.impl.agents.runner import AgentError, CompletionRequest, CompletionResult, run_agents

openai = pytest.importorskip("openai")
aiohttp = pytest.importorskip("aiohttp")

torch.set_num_threads(1)

CHAT_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nYou have {{ tools | length }} tools.<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = [
    "user assistant tool system",
    "What is six times seven? calc 6*7 The answer is 42. Paris is the capital of France.",
    "hello world, the answer is here. capital answer calc",
] * 8


@pytest.fixture(scope="module")
def tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


class FakePolicy:
    """``generate``: replies ``script(request)`` one token per character, EOS last, cut to the budget."""

    def __init__(self, tokenizer, script):
        self.tokenizer = tokenizer
        self.script = script
        self.calls: list[list[CompletionRequest]] = []
        self.threads: list[threading.Thread] = []
        self.sampled: dict[str, CompletionResult] = {}

    def char_ids(self, text: str) -> list[int]:
        ids = [self.tokenizer.encode(ch, add_special_tokens=False) for ch in text]
        assert all(len(i) == 1 for i in ids)
        return [i[0] for i in ids]

    def __call__(self, requests: list[CompletionRequest]) -> list[CompletionResult]:
        self.calls.append(list(requests))
        self.threads.append(threading.current_thread())
        results = []
        for r in requests:
            tokens = self.char_ids(self.script(self, r)) + [self.tokenizer.eos_token_id]
            no_eos = len(tokens) > r.max_new_tokens
            tokens = tokens[: r.max_new_tokens]
            logprobs = [-0.01 * (i + 1) - 0.5 * len(self.sampled) for i in range(len(tokens))]
            self.sampled[r.key] = CompletionResult(tokens, logprobs, no_eos)
            results.append(self.sampled[r.key])
        return results

    def context_text(self, r: CompletionRequest) -> str:
        return self.tokenizer.decode(r.context, skip_special_tokens=False)


def tool_script(policy: FakePolicy, r: CompletionRequest) -> str:
    return "The answer is 42." if "<|im_start|>tool\n" in policy.context_text(r) else "calc 6*7"


def run(tokenizer, agent, policy, n=1, **kwargs):
    options = dict(max_new_tokens=64, max_total_tokens=None, timeout=20.0)
    options.update(kwargs)
    return run_agents(
        agent,
        prompts=[f"What is six times seven? ({i})" for i in range(n)],
        metadata=[{"answer": "42"} for _ in range(n)],
        tokenizer=tokenizer,
        generate=policy,
        sample_ids=[f"sample-{i}" for i in range(n)],
        **options,
    )


async def tool_agent(client, prompt: str, answer: str) -> float:
    """Two completions, a calculator in between, as a user would write it."""
    messages = [{"role": "user", "content": prompt}]
    first = await client.chat.completions.create(model="policy", messages=messages, logprobs=True)
    call = first.choices[0].message.content
    assert call.startswith("calc ")
    a, b = call.removeprefix("calc ").split("*")
    messages += [{"role": "assistant", "content": call}, {"role": "tool", "content": str(int(a) * int(b))}]
    second = await client.chat.completions.create(model="policy", messages=messages)
    assert second.choices[0].finish_reason == "stop"
    return float(answer in second.choices[0].message.content)


def test_tool_agent_is_one_token_in_token_out_trajectory(tokenizer):
    policy = FakePolicy(tokenizer, tool_script)
    (traj,), stats = run(tokenizer, tool_agent, policy)
    first, second = (policy.sampled[f"sample-0/{k}"] for k in range(2))
    ctx1, ctx2 = (call[0].context for call in policy.calls)
    # the model's turns are the ids it sampled, not their canonical re-encoding
    assert tokenizer.encode("calc 6*7", add_special_tokens=False) != first.tokens[:-1]
    assert traj.tokens == ctx2 + second.tokens
    assert traj.tokens[len(ctx1) : len(ctx1) + len(first.tokens)] == first.tokens
    spans = [range(len(ctx1), len(ctx1) + len(first.tokens)), range(len(ctx2), len(traj.tokens))]
    model_positions = [i for span in spans for i in span]
    assert [i for i, m in enumerate(traj.model_mask) if m] == model_positions
    assert [traj.logprobs[i] for i in spans[0]] == first.logprobs
    assert [traj.logprobs[i] for i in spans[1]] == second.logprobs
    assert all(traj.logprobs[i] == 0.0 for i in range(len(traj.tokens)) if not traj.model_mask[i])
    # the tool's text (and the template around it) is not the model's
    tool_turn = tokenizer.encode("<|im_start|>tool\n42<|im_end|>\n", add_special_tokens=False)
    between = traj.tokens[spans[0].stop : spans[1].start]
    assert tool_turn[0] in between and not any(traj.model_mask[spans[0].stop : spans[1].start])
    # decoded, the trajectory is the conversation as the template renders it
    conversation = [
        {"role": "user", "content": "What is six times seven? (0)"},
        {"role": "assistant", "content": "calc 6*7"},
        {"role": "tool", "content": "42"},
        {"role": "assistant", "content": "The answer is 42."},
    ]
    assert tokenizer.decode(traj.tokens) == tokenizer.apply_chat_template(
        conversation, tokenize=False
    ).removesuffix("\n")
    assert traj.prompt_len == len(ctx1) and ctx1 == tokenizer.apply_chat_template(
        conversation[:1], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert (traj.turns, traj.turn_tokens, traj.no_eos, traj.reward) == (
        2,
        [len(first.tokens), len(second.tokens)],
        False,
        1.0,
    )
    assert traj.env_seconds >= 0.0
    assert policy.threads == [threading.current_thread()] * 2  # generate runs on the caller's thread
    assert stats["agent/completions_mean"] == 2.0 and stats["agent/unchained_completions"] == 0.0
    assert stats["agent/seconds"] > 0.0


def test_requests_of_many_agents_are_batched(tokenizer):
    async def agent(client, prompt: str, answer: str) -> float:
        await asyncio.sleep(0.01 * len(prompt) % 0.05)  # the agents reach the policy at different times
        return await tool_agent(client, prompt, answer)

    policy = FakePolicy(tokenizer, tool_script)
    trajectories, stats = run(tokenizer, agent, policy, n=4)
    assert [len(c) for c in policy.calls] == [4, 4]
    assert sorted(r.key for r in policy.calls[0]) == [f"sample-{i}/0" for i in range(4)]
    assert [t.reward for t in trajectories] == [1.0] * 4
    for i, t in enumerate(trajectories):
        assert f"({i})" in tokenizer.decode(t.tokens[: t.prompt_len])
    assert stats["agent/generate_calls"] == 2.0


def test_a_restarted_conversation_drops_the_earlier_completion(tokenizer):
    async def agent(client, prompt: str, answer: str) -> float:
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hello"}])
        # the agent starts over: the first completion is not on the trajectory
        return await tool_agent(client, prompt, answer)

    policy = FakePolicy(tokenizer, tool_script)
    (traj,), stats = run(tokenizer, agent, policy)
    assert traj.turns == 2 and stats["agent/unchained_completions"] == 1.0
    assert stats["agent/completions_mean"] == 3.0
    assert "hello" not in tokenizer.decode(traj.tokens)


def test_bearer_token_is_required_and_the_port_closes(tokenizer):
    seen: dict = {}

    async def agent(client, prompt: str, answer: str) -> float:
        url = str(client.base_url).rstrip("/")
        seen["port"] = client.base_url.port
        body = {"model": "m", "messages": [{"role": "user", "content": prompt}]}
        async with aiohttp.ClientSession(trust_env=False) as http:
            async with http.post(f"{url}/chat/completions", json=body) as r:
                seen["no_token"] = r.status
            async with http.post(
                f"{url}/chat/completions", json=body, headers={"Authorization": "Bearer x"}
            ) as r:
                seen["wrong_token"] = r.status
            async with http.get(f"{url}/models") as r:
                seen["models_no_token"] = r.status
        seen["models"] = [m.id async for m in client.models.list()]
        with pytest.raises(openai.BadRequestError, match="n=1"):
            await client.chat.completions.create(model="m", messages=body["messages"], n=2)
        reply = await client.chat.completions.create(model="m", messages=body["messages"], logprobs=True)
        seen["logprobs"] = [(c.token, c.logprob) for c in reply.choices[0].logprobs.content]
        seen["usage"] = reply.usage
        return 1.0

    policy = FakePolicy(tokenizer, lambda p, r: "Paris")
    run(tokenizer, agent, policy)
    assert (seen["no_token"], seen["wrong_token"], seen["models_no_token"]) == (401, 401, 401)
    assert seen["models"] == ["policy"]
    sampled = policy.sampled["sample-0/0"]
    assert seen["logprobs"] == [
        (tokenizer.decode([t]), lp) for t, lp in zip(sampled.tokens, sampled.logprobs)
    ]
    assert seen["usage"].completion_tokens == len(sampled.tokens)
    assert seen["usage"].prompt_tokens == len(policy.calls[0][0].context)
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", seen["port"]), timeout=2).close()
    assert not any(t.name == "realrl-agent-endpoint" for t in threading.enumerate())


async def raising_agent(client, prompt: str, answer: str) -> float:
    await client.chat.completions.create(model="m", messages=[{"role": "user", "content": prompt}])
    raise ValueError("the tool broke")


async def nan_agent(client, prompt: str, answer: str) -> float:
    await client.chat.completions.create(model="m", messages=[{"role": "user", "content": prompt}])
    return math.nan


async def bool_agent(client, prompt: str, answer: str) -> bool:
    await client.chat.completions.create(model="m", messages=[{"role": "user", "content": prompt}])
    return True


async def slow_agent(client, prompt: str, answer: str) -> float:
    await asyncio.sleep(60)
    return 0.0


async def silent_agent(client, prompt: str, answer: str) -> float:
    return 0.0


@pytest.mark.parametrize(
    "agent, message",
    [
        (raising_agent, "the tool broke"),
        (nan_agent, "finite reward"),
        (bool_agent, "real number"),
        (slow_agent, "timeout of 0.5 s"),
        (silent_agent, "no chat completion"),
    ],
)
def test_a_failing_agent_raises_agent_error_naming_the_sample(tokenizer, agent, message):
    policy = FakePolicy(tokenizer, lambda p, r: "Paris")
    with pytest.raises(AgentError, match=message) as info:
        run(tokenizer, agent, policy, n=2, timeout=0.5)
    assert "sample-" in str(info.value) and agent.__qualname__ in str(info.value)
    if agent is raising_agent:
        assert "Traceback" in str(info.value) and "raising_agent" in str(info.value)
    assert not any(t.name == "realrl-agent-endpoint" for t in threading.enumerate())


def test_max_total_tokens_caps_a_completion_and_refuses_the_next(tokenizer):
    seen: dict = {}

    async def agent(client, prompt: str, answer: str) -> float:
        messages = [{"role": "user", "content": prompt}]
        reply = await client.chat.completions.create(model="m", messages=messages, max_tokens=50)
        seen["finish"] = reply.choices[0].finish_reason
        messages += [{"role": "assistant", "content": reply.choices[0].message.content}]
        messages += [{"role": "user", "content": "and then?"}]
        try:
            await client.chat.completions.create(model="m", messages=messages)
        except openai.BadRequestError as e:
            seen["refused"] = str(e)
        return 0.0

    prompt_len = len(
        tokenizer.apply_chat_template(
            [{"role": "user", "content": "What is six times seven? (0)"}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
    )
    policy = FakePolicy(tokenizer, lambda p, r: "The answer is 42.")
    (traj,), _ = run(tokenizer, agent, policy, max_total_tokens=prompt_len + 5)
    assert [r.max_new_tokens for c in policy.calls for r in c] == [5]
    assert seen["finish"] == "length" and "max_total_tokens" in seen["refused"]
    assert len(traj.tokens) == prompt_len + 5 and traj.no_eos and traj.turns == 1

    # a request's own max_tokens is honoured when it is the smallest
    async def short(client, prompt: str, answer: str) -> float:
        messages = [{"role": "user", "content": prompt}]
        await client.chat.completions.create(model="m", messages=messages, max_completion_tokens=3)
        return 0.0

    policy = FakePolicy(tokenizer, lambda p, r: "The answer is 42.")
    (traj,), _ = run(tokenizer, short, policy, max_total_tokens=prompt_len + 5)
    assert [r.max_new_tokens for c in policy.calls for r in c] == [3] and traj.turn_tokens == [3]


def test_a_tokenizer_without_chat_template_renders_the_conversation_as_plain_text(tokenizer):
    """A toy or base model's tokenizer: messages back to back, each assistant turn ended by EOS,
    the same tokens a trajectory with an environment has (``chat_turns.PLAIN_CHAT_TEMPLATE``)."""
    from transformers import PreTrainedTokenizerFast

    plain = PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend_tokenizer, eos_token="<|im_end|>")
    assert plain.chat_template is None

    def script(policy, r):
        return "done" if "= 42" in policy.context_text(r) else "calc"

    async def agent(client, prompt: str, answer: str) -> float:
        messages = [{"role": "user", "content": prompt}]
        first = await client.chat.completions.create(model="policy", messages=messages)
        messages += [{"role": "assistant", "content": first.choices[0].message.content}]
        messages += [{"role": "tool", "content": "= 42"}]
        await client.chat.completions.create(model="policy", messages=messages)
        return 1.0

    policy = FakePolicy(plain, script)
    (traj,), _ = run(plain, agent, policy)
    eos = plain.eos_token_id
    prompt = plain.encode("What is six times seven? (0)", add_special_tokens=False)
    turn1 = policy.char_ids("calc") + [eos]
    obs = plain.encode("= 42", add_special_tokens=False)
    turn2 = policy.char_ids("done") + [eos]
    assert traj.tokens == prompt + turn1 + obs + turn2
    assert traj.model_mask == [False] * len(prompt) + [True] * len(turn1) + [False] * len(obs) + [True] * len(
        turn2
    )
