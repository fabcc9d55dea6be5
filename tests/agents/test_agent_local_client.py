"""The agents' own clients reach the endpoint without a socket (``local_client``): what they are
answered is the server's ``answer``, the same as any HTTP client gets, from the agents' loop or
from another thread's."""

from __future__ import annotations

import asyncio

import pytest

openai = pytest.importorskip("openai")
aiohttp = pytest.importorskip("aiohttp")

from agents import test_agent_endpoint as endpoint_tests  # noqa: E402

tokenizer = endpoint_tests.tokenizer  # the tiny ChatML tokenizer (a fixture)
FakePolicy, run, tool_agent = endpoint_tests.FakePolicy, endpoint_tests.run, endpoint_tests.tool_agent


def test_the_client_and_the_socket_get_the_same_answers(tokenizer):
    seen: dict = {}

    async def agent(client, prompt: str, answer: str) -> float:
        url = str(client.base_url).rstrip("/")
        headers = {"Authorization": f"Bearer {client.api_key}"}
        async with aiohttp.ClientSession(trust_env=False) as http:
            async with http.get(f"{url}/models", headers=headers) as r:
                seen["socket_models"] = (r.status, await r.json())
            async with http.get(f"{url}/nowhere", headers=headers) as r:
                seen["socket_404"] = r.status
            async with http.get(f"{url}/chat/completions", headers=headers) as r:
                seen["socket_405"] = r.status
        seen["client_models"] = await client.get("/models", cast_to=object)  # the JSON as sent
        for name, path in (("client_404", "/nowhere"), ("client_405", "/chat/completions")):
            try:
                await client.get(path, cast_to=object)
            except openai.APIStatusError as e:
                seen[name] = e.status_code
        with pytest.raises(openai.AuthenticationError):
            await client.with_options(api_key="wrong").models.list()
        return await tool_agent(client, prompt, answer)

    policy = FakePolicy(tokenizer, lambda p, r: "The answer is 42." if len(p.calls) > 1 else "calc 6*7")
    (traj,), _ = run(tokenizer, agent, policy)
    status, models = seen["socket_models"]
    assert status == 200 and seen["client_models"] == models
    assert seen["socket_404"] == seen["client_404"] == 404
    assert seen["socket_405"] == seen["client_405"] == 405
    assert traj.reward == 1.0 and traj.turns == 2


def test_a_client_used_on_another_threads_loop_is_answered(tokenizer):
    async def agent(client, prompt: str, answer: str) -> float:
        messages = [{"role": "user", "content": prompt}]

        def elsewhere():  # a blocking library with an event loop of its own, in a worker thread
            return asyncio.run(client.chat.completions.create(model="policy", messages=messages))

        reply = await asyncio.to_thread(elsewhere)
        return float(reply.choices[0].message.content == "Paris")

    policy = FakePolicy(tokenizer, lambda p, r: "Paris")
    trajectories, stats = run(tokenizer, agent, policy, n=2)
    assert [t.reward for t in trajectories] == [1.0, 1.0]
    assert stats["agent/generate_calls"] == 1.0  # both requests in one batch, as from the agents' loop
