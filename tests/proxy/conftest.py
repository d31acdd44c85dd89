"""Small in-process OpenAI-style backends on real 127.0.0.1 sockets, with knobs to be slow,
fail, hang or die, and a fixture that starts a proxy in front of them."""

from __future__ import annotations

import asyncio
import json
import random
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace

import pytest
from aiohttp import web

from proxy.app import RunningProxy, start_proxy
from proxy.config import BackendSpec, BreakerConfig, HealthConfig, ProxyConfig, RetryConfig, TimeoutConfig


@dataclass
class Knobs:
    """How a fake backend behaves; tests flip these while it runs."""

    chunks: int = 4
    """Content chunks per response (each one token)."""
    chunk_delay_s: float = 0.0
    """Pause before each chunk: the engine's time per output token."""
    first_byte_delay_s: float = 0.0
    """Pause before the response headers (queueing plus prefill)."""
    status: int = 200
    """Answer every generation request with this status (an OpenAI error body) when not 200."""
    retry_after: str | None = None
    error_message: str | None = None
    """The error body's message when `status` is not 200 (default: "<name> says <status>")."""
    die_before_first_byte: bool = False
    """Drop the connection without answering, like a crashed engine."""
    die_after_chunks: int | None = None
    """Drop the connection after this many streamed chunks."""
    truncate_body: bool = False
    """Promise a 1000-byte JSON body, send 10 bytes of it, drop the connection."""
    health_status: int = 200
    health_body: bytes = b""
    metrics_text: str = ""
    cached_tokens: int = 0
    required_authorization: str | None = None
    """Answer 401 to any request (probes and scrapes too) without this Authorization header."""


@dataclass
class FakeBackend:
    name: str
    knobs: Knobs = field(default_factory=Knobs)
    models: tuple[str, ...] = ("tiny-llama",)
    adapters: tuple[str, ...] = ()
    """LoRA adapters, listed by /v1/models with the first model as parent (as vLLM does)."""
    runner: web.AppRunner | None = None
    port: int = 0
    received: int = 0
    """Generation requests that arrived."""
    running: int = 0
    """Generation requests being answered now (like vllm:num_requests_running)."""
    cancelled: int = 0
    cancelled_at: list[float] = field(default_factory=list)
    finished_at: list[float] = field(default_factory=list)
    """time.monotonic() at which each request's last chunk was written."""
    request_headers: list = field(default_factory=list)
    targets: list[str] = field(default_factory=list)
    """The request target (path and query, as sent) of each generation request."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self, port: int = 0) -> None:
        app = web.Application(middlewares=[self.check_authorization])
        app.add_routes([web.post("/v1/completions", self.generate), web.post("/v1/chat/completions", self.generate),
                        web.post("/v1/messages", self.generate),  # answered in the completions shape
                        web.get("/v1/models", self.list_models), web.get("/health", self.health),
                        web.get("/metrics", self.metrics), web.post("/tokenize", self.tokenize)])
        self.runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", port or self.port, reuse_address=True)
        await site.start()
        self.port = self.runner.addresses[0][1]

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None

    @web.middleware
    async def check_authorization(self, request: web.Request, handler) -> web.StreamResponse:
        required = self.knobs.required_authorization
        if required is not None and request.headers.get("Authorization") != required:
            return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    async def list_models(self, request: web.Request) -> web.Response:
        data = [{"id": m, "object": "model", "owned_by": "fake", "parent": None} for m in self.models]
        data += [{"id": a, "object": "model", "owned_by": "fake", "parent": self.models[0]} for a in self.adapters]
        return web.json_response({"object": "list", "data": data})

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=self.knobs.health_status, body=self.knobs.health_body)

    async def metrics(self, request: web.Request) -> web.Response:
        if not self.knobs.metrics_text:
            return web.Response(status=404)
        return web.Response(text=self.knobs.metrics_text, content_type="text/plain")

    async def tokenize(self, request: web.Request) -> web.Response:
        return web.json_response({"count": 3, "backend": self.name})

    async def generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.received += 1
        self.request_headers.append(request.headers.copy())
        self.targets.append(request.raw_path)
        self.running += 1
        try:
            return await self._answer(request, body)
        except asyncio.CancelledError:
            self.cancelled += 1
            self.cancelled_at.append(time.monotonic())
            raise
        finally:
            self.running -= 1

    async def _answer(self, request: web.Request, body: dict) -> web.StreamResponse:
        k = self.knobs
        if k.first_byte_delay_s:
            await asyncio.sleep(k.first_byte_delay_s)
        if k.die_before_first_byte:
            request.transport.close()
            raise asyncio.CancelledError
        if k.status != 200:
            headers = {"Retry-After": k.retry_after} if k.retry_after else {}
            message = k.error_message or f"{self.name} says {k.status}"
            return web.json_response({"error": {"message": message, "type": "x",
                                                "code": k.status}}, status=k.status, headers=headers)
        chat = request.path.endswith("chat/completions")
        if k.truncate_body:
            resp = web.StreamResponse(headers={"Content-Type": "application/json", "Content-Length": "1000"})
            await resp.prepare(request)
            await resp.write(b'{"id": "cm')
            request.transport.close()
            raise asyncio.CancelledError
        if body.get("stream"):
            return await self._stream(request, body, chat)
        for _ in range(k.chunks):
            await asyncio.sleep(k.chunk_delay_s)
        self.finished_at.append(time.monotonic())
        return web.json_response(self._completion(body, chat))

    def _text(self) -> str:
        return "".join(f"{self.name}-{i} " for i in range(self.knobs.chunks))

    def _usage(self) -> dict:
        return {"prompt_tokens": 10, "completion_tokens": self.knobs.chunks, "total_tokens": 10 + self.knobs.chunks,
                "prompt_tokens_details": {"cached_tokens": self.knobs.cached_tokens}}

    def _completion(self, body: dict, chat: bool) -> dict:
        choice = ({"index": 0, "message": {"role": "assistant", "content": self._text()}, "finish_reason": "length"}
                  if chat else {"index": 0, "text": self._text(), "finish_reason": "length"})
        return {"id": "cmpl-1", "object": "chat.completion" if chat else "text_completion", "created": 1,
                "model": body.get("model", self.models[0]), "choices": [choice], "usage": self._usage()}

    def _chunk(self, body: dict, chat: bool, i: int) -> bytes:
        text = f"{self.name}-{i} "
        choice = {"index": 0, "delta": {"content": text}, "finish_reason": None} if chat else \
            {"index": 0, "text": text, "finish_reason": None}
        obj = {"id": "cmpl-1", "object": "chat.completion.chunk" if chat else "text_completion", "created": 1,
               "model": body.get("model", self.models[0]), "choices": [choice]}
        return f"data: {json.dumps(obj)}\n\n".encode()

    async def _stream(self, request: web.Request, body: dict, chat: bool) -> web.StreamResponse:
        k = self.knobs
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(k.chunks):
            if k.die_after_chunks is not None and i == k.die_after_chunks:
                request.transport.close()
                raise asyncio.CancelledError
            await asyncio.sleep(k.chunk_delay_s)
            await resp.write(self._chunk(body, chat, i))
        self.finished_at.append(time.monotonic())
        if (body.get("stream_options") or {}).get("include_usage"):
            obj = {"id": "cmpl-1", "object": "chat.completion.chunk", "created": 1, "choices": [],
                   "usage": self._usage()}
            await resp.write(f"data: {json.dumps(obj)}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


def free_port() -> int:
    """A port nothing listens on (yet): connections to it are refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


BackendFactory = Callable[..., Awaitable[FakeBackend]]


@pytest.fixture
async def fake_backend() -> AsyncIterator[BackendFactory]:
    started: list[FakeBackend] = []

    async def make(name: str | None = None, **knobs: object) -> FakeBackend:
        b = FakeBackend(name=name or f"b{len(started)}", knobs=Knobs(**knobs))
        await b.start()
        started.append(b)
        return b

    yield make
    for b in started:
        await b.stop()


def fast_config(backends: list, **overrides: object) -> ProxyConfig:
    """A proxy config on a free port with short, test-sized timeouts and intervals.

    `backends` holds BackendSpecs, or anything with a `url` (taken as an openai-flavor backend)."""
    specs = [b if isinstance(b, BackendSpec) else BackendSpec(url=b.url) for b in backends]
    base = ProxyConfig(
        port=0, policy="least-outstanding", backends=specs,
        scrape_interval_s=0.05,
        timeouts=TimeoutConfig(connect_s=1.0, first_byte_s=5.0, idle_s=5.0, total_s=20.0),
        retry=RetryConfig(max_attempts=3, initial_backoff_s=0.01, max_backoff_s=0.05, max_retry_after_s=0.2),
        breaker=BreakerConfig(failure_threshold=2, success_threshold=1, open_s=0.3),
        health=HealthConfig(interval_s=0.1, timeout_s=0.5),
    )
    return replace(base, **overrides)


ProxyFactory = Callable[..., Awaitable[RunningProxy]]


@pytest.fixture
async def proxy_for() -> AsyncIterator[ProxyFactory]:
    running: list[RunningProxy] = []

    async def make(backends: list, **overrides: object) -> RunningProxy:
        p = await start_proxy(fast_config(backends, **overrides), rng=random.Random(7))
        running.append(p)
        return p

    yield make
    for p in running:
        await p.close()
