"""The client each agent is given: an ``openai.AsyncOpenAI`` at the endpoint's URL whose requests to
the endpoint are answered without a socket.

Why: most of an agent's cost is not the policy's. Over loopback TCP every completion is HTTP/1.1
written and parsed twice (httpx on the agent's side, aiohttp on the server's) on the same event
loop, a few milliseconds of CPU each; the HTTP library under the OpenAI client (httpx, or the fork
newer releases use) lets a transport answer the requests for one origin itself. This one hands
them to ``EndpointServer.answer``, which is what the server itself says to a request, so the agent
sees the same statuses, bodies and errors. The server still listens at ``client.base_url``: an
agent that talks to it with another library gets the same answers over the socket.

Every client also shares one TLS context, for whatever other URL an agent points it at: building
one loads the CA bundle, tens of milliseconds of CPU, which per agent was most of a rollout's time.
"""

from __future__ import annotations

import asyncio
import importlib
import ssl
from collections.abc import Callable
from typing import Any

from realrl.impl.agents.endpoint import EndpointServer


def http_library(openai: Any) -> Any:
    """The module whose ``AsyncClient`` the OpenAI client is built on; None if it cannot be told."""
    default = getattr(openai, "DefaultAsyncHttpxClient", None)
    base = next((c for c in getattr(default, "__mro__", ()) if c.__name__ == "AsyncClient"), None)
    if base is None:
        return None
    http = importlib.import_module(base.__module__.partition(".")[0])
    needed = ("AsyncBaseTransport", "Response")
    return http if all(hasattr(http, name) for name in needed) else None


def _local_transport(http: Any, server: EndpointServer) -> Any:
    """A transport of ``http`` that answers with ``server.answer``, on the server's loop."""

    class LocalTransport(http.AsyncBaseTransport):
        async def handle_async_request(self, request: Any) -> Any:
            body = await request.aread()
            args = (request.method, request.url.path, request.headers.get("Authorization", ""), body)
            if asyncio.get_running_loop() is server.loop:
                status, payload, headers = await server.answer(*args)
            else:  # a client used from another thread's loop: answer it on the server's
                future = asyncio.run_coroutine_threadsafe(server.answer(*args), server.loop)
                status, payload, headers = await asyncio.wrap_future(future)
            return http.Response(status, headers=headers, json=payload, request=request)

    return LocalTransport()


def client_factory(openai: Any, server: EndpointServer, timeout: float) -> Callable[[str], Any]:
    """``api_key -> openai.AsyncOpenAI`` for the agents of one rollout; each client has its own
    connection pool (an agent may close its client), the transport and TLS context are shared."""
    common = {"base_url": server.base_url, "max_retries": 0, "timeout": timeout}
    http = http_library(openai)
    if http is None:  # an HTTP library this module does not know: a plain client, over the socket
        return lambda api_key: openai.AsyncOpenAI(api_key=api_key, **common)
    local = _local_transport(http, server)
    make_tls = getattr(http, "create_ssl_context", None)
    # trust_env=False: no proxy or CA bundle from the environment between an agent and its policy
    tls = make_tls(trust_env=False) if make_tls is not None else ssl.create_default_context()
    origin = server.base_url.rsplit("/", 1)[0]  # http://127.0.0.1:<port>

    def make(api_key: str) -> Any:
        http_client = openai.DefaultAsyncHttpxClient(trust_env=False, verify=tls, mounts={origin: local})
        return openai.AsyncOpenAI(api_key=api_key, http_client=http_client, **common)

    return make
