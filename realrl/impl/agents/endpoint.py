"""An OpenAI-compatible chat-completions server on 127.0.0.1 that lives only as long as a rollout.

Why aiohttp: it is an asyncio server, so it runs in the same event loop as the agents' coroutines
(an agent's request and the handler that answers it are two coroutines of one loop, in one
background thread); it is small and well kept, and needs no separate ASGI server process.

The server speaks HTTP and JSON only: what a completion is (rendering, token budgets, batching) is
the ``handler``'s, supplied by ``runner``. ``answer`` is the whole of what it says to a request,
apart from aiohttp, so that the agents' own clients can reach it without a socket
(``local_client``) and get the same answers as any other HTTP client. Every request must carry one of the bearer tokens the
server was given (an unguessable one per agent, which also says which agent is asking), so no other
local process can drive the policy; anything else gets 401.

Routes: ``POST /v1/chat/completions`` (``n=1``, no streaming; ``max_tokens`` /
``max_completion_tokens`` and ``logprobs`` are honoured, every other sampling parameter is ignored:
the run's generation config decides them) and ``GET /v1/models``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any

from aiohttp import web

logger = logging.getLogger(__name__)

MODEL_NAME = "policy"  # what GET /v1/models lists; a request may name any model
START_TIMEOUT = 30.0  # seconds to wait for the server thread to listen
STOP_TIMEOUT = 10.0  # seconds to wait for it to finish
MAX_BODY = 64 * 2**20  # bytes a request body may have


class RequestError(Exception):
    """A request the endpoint refuses: answered with ``status`` and ``message`` in OpenAI's error shape."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.message = message
        self.status = status


@dataclasses.dataclass
class ChatRequest:
    """The parts of a chat-completions request that realrl uses."""

    messages: list[dict[str, Any]]  # each message's content a string (or None)
    tools: list[dict[str, Any]] | None
    max_tokens: int | None  # the smaller of max_tokens and max_completion_tokens, if either is given
    logprobs: bool
    model: str


@dataclasses.dataclass
class ChatReply:
    """One completion, as the handler produced it."""

    text: str  # the sampled tokens decoded, without the final EOS
    tokens: list[int]  # the sampled ids (ending with EOS unless the budget cut it)
    token_texts: list[str]  # each sampled token decoded alone
    logprobs: list[float]  # one per sampled token
    prompt_tokens: int  # the context's length
    no_eos: bool


# (the identity the request's bearer token maps to, the request) -> the reply; raises RequestError
ChatHandler = Callable[[Any, ChatRequest], Awaitable[ChatReply]]
# (HTTP status, JSON body, extra headers)
Answer = tuple[int, dict[str, Any], dict[str, str]]


def _error(status: int, message: str, code: str | None = None) -> Answer:
    kind = "invalid_request_error" if status < 500 else "server_error"
    body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return status, body, {"WWW-Authenticate": "Bearer"} if status == 401 else {}


def _digest(token: str) -> bytes:
    # tokens are looked up by their hash: a lookup's timing says nothing about the token itself
    return hashlib.sha256(token.encode()).digest()


def _content_text(content: Any, where: str) -> str | None:
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if (
                not isinstance(part, dict)
                or part.get("type") != "text"
                or not isinstance(part.get("text"), str)
            ):
                raise RequestError(f"{where}: only text content parts are supported")
            parts.append(part["text"])
        return "".join(parts)
    raise RequestError(f"{where}: content must be a string, null or a list of text parts")


def _positive_int(body: Mapping[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise RequestError(f"{key} must be a positive integer, got {value!r}")
    return value


def parse_chat_request(body: Any) -> ChatRequest:
    """Validate a chat-completions body; RequestError (400) says what is wrong or unsupported."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list")
    normalised = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise RequestError(f"messages[{i}] must be an object with a string role")
        normalised.append({**m, "content": _content_text(m.get("content"), f"messages[{i}]")})
    n = body.get("n")
    if n is not None and n != 1:
        raise RequestError(f"only n=1 is supported, got n={n!r}")
    if body.get("stream"):
        raise RequestError("streaming is not supported")
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise RequestError("tools must be a list")
    limits = [
        v for v in (_positive_int(body, "max_tokens"), _positive_int(body, "max_completion_tokens")) if v
    ]
    model = body.get("model")
    return ChatRequest(
        messages=normalised,
        tools=tools or None,
        max_tokens=min(limits) if limits else None,
        logprobs=bool(body.get("logprobs")),
        model=model if isinstance(model, str) and model else MODEL_NAME,
    )


def chat_completion_json(chat: ChatRequest, reply: ChatReply) -> dict[str, Any]:
    """The standard ``chat.completion`` object for one reply. With ``logprobs``, every sampled
    token's recorded log-prob (the final EOS included), ``top_logprobs`` left empty."""
    logprobs = None
    if chat.logprobs:
        logprobs = {
            "content": [
                {"token": text, "logprob": lp, "bytes": list(text.encode()), "top_logprobs": []}
                for text, lp in zip(reply.token_texts, reply.logprobs)
            ]
        }
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": chat.model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": reply.text},
                "logprobs": logprobs,
                "finish_reason": "length" if reply.no_eos else "stop",
            }
        ],
        "usage": {
            "prompt_tokens": reply.prompt_tokens,
            "completion_tokens": len(reply.tokens),
            "total_tokens": reply.prompt_tokens + len(reply.tokens),
        },
    }


class EndpointServer:
    """The server in a background thread with its own event loop, on an ephemeral port of 127.0.0.1.

    ``clients`` maps each accepted bearer token to the identity the handler receives. ``spawn``
    runs coroutines (the agents) on the same loop; ``stop`` cancels those still running, stops
    listening and ends the thread. Use as a context manager so it is stopped on every path.
    """

    def __init__(self, handler: ChatHandler, clients: Mapping[str, Any]):
        self._handler = handler
        self._clients = {_digest(token): identity for token, identity in clients.items()}
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._spawned: set[asyncio.Task] = set()
        self._start_error: BaseException | None = None
        self._thread = threading.Thread(target=self._thread_main, name="realrl-agent-endpoint", daemon=True)
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The loop the server and the spawned coroutines run on."""
        return self._loop

    def __enter__(self) -> EndpointServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self._thread.start()
        if not self._ready.wait(START_TIMEOUT):
            self.stop()
            raise RuntimeError(f"the agent endpoint did not start listening within {START_TIMEOUT:.0f} s")
        if self._start_error is not None:
            raise RuntimeError(
                f"the agent endpoint failed to start: {self._start_error!r}"
            ) from self._start_error

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the server's loop (from any thread)."""
        self._loop.call_soon_threadsafe(fn, *args)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run ``coro`` as a task on the server's loop until it ends or the server stops."""
        self.call_soon(self._spawn, coro)

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = self._loop.create_task(coro)
        self._spawned.add(task)
        task.add_done_callback(self._spawned.discard)

    def stop(self) -> None:
        """Cancel the spawned tasks, close the port and end the thread; waits at most STOP_TIMEOUT."""
        if not self._thread.is_alive():
            return
        stop = self._stop
        if stop is not None:
            try:
                self._loop.call_soon_threadsafe(stop.set)
            except RuntimeError:  # the loop is already closed
                pass
        self._thread.join(STOP_TIMEOUT)
        if self._thread.is_alive():
            logger.warning(
                "the agent endpoint's thread did not stop within %.0f s (does an agent block the event loop?)",
                STOP_TIMEOUT,
            )

    def _thread_main(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._serve())
        except BaseException as e:  # noqa: BLE001 - handed to start()
            self._start_error = e
        finally:
            self._ready.set()
            leftover = [t for t in asyncio.all_tasks(self._loop) if not t.done()]
            for t in leftover:
                t.cancel()
            if leftover:
                self._loop.run_until_complete(asyncio.wait(leftover, timeout=2.0))
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())
            self._loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        app = web.Application(client_max_size=MAX_BODY)
        app.router.add_route("*", "/{path:.*}", self._route)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        try:
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            self.port = runner.addresses[0][1]
            self._ready.set()
            await self._stop.wait()
            tasks = [t for t in self._spawned if not t.done()]
            for t in tasks:
                t.cancel()
            if tasks:
                await asyncio.wait(tasks, timeout=5.0)
        finally:
            await runner.cleanup()

    async def _route(self, request: web.Request) -> web.Response:
        authorization = request.headers.get("Authorization", "")
        known = self._identity(authorization) is not None  # a body is read for a known client only
        body = await request.read() if known and request.method == "POST" else b""
        status, payload, headers = await self.answer(request.method, request.path, authorization, body)
        return web.json_response(payload, status=status, headers=headers)

    def _identity(self, authorization: str) -> Any:
        """Whom an ``Authorization`` header's bearer token belongs to; None without a known one."""
        scheme, _, token = authorization.partition(" ")
        return self._clients.get(_digest(token.strip())) if scheme.lower() == "bearer" else None

    async def answer(self, method: str, path: str, authorization: str, body: bytes) -> Answer:
        """The answer to one request, however it arrived: over the socket, or from an agent's own
        client without one (``local_client``). Every route needs a known bearer token."""
        identity = self._identity(authorization)
        if identity is None:
            return _error(
                401, "missing or wrong bearer token (use the api_key the agent was given)", "invalid_api_key"
            )
        if path == "/v1/models":
            if method != "GET":
                return _error(405, f"{method} is not allowed on {path}")
            model = {"id": MODEL_NAME, "object": "model", "created": 0, "owned_by": "realrl"}
            return 200, {"object": "list", "data": [model]}, {}
        if path != "/v1/chat/completions":
            return _error(404, f"no route {path} (the endpoint serves /v1/chat/completions and /v1/models)")
        if method != "POST":
            return _error(405, f"{method} is not allowed on {path}")
        try:
            try:
                parsed = json.loads(body)
            except ValueError as e:
                raise RequestError(f"the request body is not JSON: {e}") from e
            chat = parse_chat_request(parsed)
            reply = await self._handler(identity, chat)
        except RequestError as e:
            return _error(e.status, e.message)
        except Exception as e:  # noqa: BLE001 - the agent sees it as a 500 naming the cause
            logger.exception("the agent endpoint failed on a request")
            return _error(500, f"the endpoint failed: {type(e).__name__}: {e}")
        return 200, chat_completion_json(chat, reply), {}
