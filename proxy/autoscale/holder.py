"""Scale from zero: hold requests while no replica is ready, instead of failing them.

A generation request that finds no ready backend waits (bounded in count and in time) and asks
the autoscaler for a replica at once. A streaming client gets its response headers and an SSE
comment line (`: waiting for a replica`) every `keepalive_s`, so neither it nor anything between
it and the proxy gives up; once a replica is ready the request goes through the proxy's normal
path. Past the bounds the answer is a 503 whose Retry-After says when a replica should be ready.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Awaitable, Callable

import aiohttp
from aiohttp import web

from policies.routing.base import BackendState
from proxy.app import generation_body, is_forwarded
from proxy.autoscale.config import HoldSettings
from proxy.errors import ProxyError, error_response, sse_error_event
from proxy.pool import BackendPool

HELD_HEADER = "x-flotilla-held"
"""Marks a held stream's request when it re-enters the proxy; such a request is never held twice."""
KEEPALIVE_LINE = b": waiting for a replica\n\n"
# Hop-by-hop and framing headers the re-entering request must not copy.
_NOT_COPIED = frozenset({"host", "content-length", "transfer-encoding", "connection", "keep-alive", "upgrade",
                         "te", "trailer", "proxy-connection", "expect"})


class Holder:
    """Holds requests until the pool has a ready backend."""

    def __init__(self, pool: BackendPool, settings: HoldSettings | None = None,
                 on_wait: Callable[[], None] = lambda: None,
                 seconds_until_ready: Callable[[], float] = lambda: 60.0,
                 on_reject: Callable[[], None] = lambda: None) -> None:
        self.pool = pool
        self.settings = settings or HoldSettings()
        self.on_wait = on_wait
        """Called when a request starts waiting (the autoscaler starts a replica)."""
        self.seconds_until_ready = seconds_until_ready
        """Real seconds until a replica should be ready; the basis of Retry-After."""
        self.on_reject = on_reject
        """Called for each request turned away at a bound (a metric counts them)."""
        self.held = 0
        self.rejected = 0

    def has_ready(self) -> bool:
        return any(b.state is BackendState.READY for b in self.pool)

    async def wait_for_ready(self, request: web.Request | None = None,
                             keepalive: Callable[[], Awaitable[None]] | None = None) -> bool:
        """True once a backend is ready; False when the hold is full or the wait ran out.
        `keepalive` is awaited every `keepalive_s` while waiting."""
        if self.has_ready():
            return True
        if self.held >= self.settings.max_requests:
            self._reject()
            return False
        self.held += 1
        try:
            self.on_wait()
            return await self._wait(keepalive)
        finally:
            self.held -= 1

    async def _wait(self, keepalive: Callable[[], Awaitable[None]] | None) -> bool:
        loop = asyncio.get_running_loop()
        start = loop.time()
        next_keepalive = start + self.settings.keepalive_s
        while not self.has_ready():
            now = loop.time()
            if now - start >= self.settings.max_wait_s:
                self._reject()
                return False
            if keepalive is not None and now >= next_keepalive:
                next_keepalive = now + self.settings.keepalive_s
                await keepalive()
            await asyncio.sleep(self.settings.poll_s)
        return True

    def _reject(self) -> None:
        self.rejected += 1
        self.on_reject()

    def retry_after_s(self) -> int:
        return max(1, math.ceil(self.seconds_until_ready()))

    def unavailable(self) -> web.Response:
        """The 503 for a request past the hold bounds."""
        wait = self.retry_after_s()
        if self.held >= self.settings.max_requests:
            message = f"No replica is ready and {self.held} requests already wait for one; retry in {wait} s."
        else:
            message = f"No replica became ready within {self.settings.max_wait_s:g} s; retry in {wait} s."
        return error_response(ProxyError(503, message, headers={"Retry-After": str(wait)}),
                              {"x-flotilla-backend": ""})


async def wants_stream(request: web.Request) -> bool:
    """The body asks for a stream, read as the handler reads it (decoded, within the body limit);
    ProxyError for a body the handler refuses."""
    _, body = await generation_body(request)
    return body.get("stream") is True


def hold_middleware(holder: Holder, on_arrival: Callable[[], None],
                    session: Callable[[], aiohttp.ClientSession | None]) -> Callable:
    """Counts arriving generation requests and holds them while no backend is ready."""

    @web.middleware
    async def middleware(request: web.Request, handler) -> web.StreamResponse:
        # Only routes the proxy forwards wait for a replica: any other gets its 404/405 at once.
        if not is_forwarded(request) or request.headers.get(HELD_HEADER):
            return await handler(request)
        on_arrival()
        if holder.has_ready():
            return await handler(request)
        try:
            stream = await wants_stream(request)
        except ProxyError:  # a body the handler refuses: its 4xx now, not after a hold
            return await handler(request)
        if not stream:
            return await handler(request) if await holder.wait_for_ready(request) else holder.unavailable()
        return await _hold_stream(holder, request, handler, session())

    return middleware


async def _hold_stream(holder: Holder, request: web.Request, handler,
                       session: aiohttp.ClientSession | None) -> web.StreamResponse:
    response: web.StreamResponse | None = None

    async def keepalive() -> None:
        nonlocal response
        if response is None:
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                                   "x-flotilla-backend": ""})
            response.enable_chunked_encoding()
            await response.prepare(request)
        await response.write(KEEPALIVE_LINE)

    ready = await holder.wait_for_ready(request, keepalive if session is not None else None)
    if response is None:
        return await handler(request) if ready else holder.unavailable()
    if ready:
        assert session is not None  # a held stream is kept alive only with a session to relay through
        await _relay_through_proxy(request, response, session)
    else:
        await response.write(sse_error_event(
            f"No replica became ready within {holder.settings.max_wait_s:g} s; retry in "
            f"{holder.retry_after_s()} s.", 503))
    await response.write_eof()
    return response


async def _relay_through_proxy(request: web.Request, response: web.StreamResponse,
                               session: aiohttp.ClientSession) -> None:
    """The held stream's headers are out already, so the request goes through the proxy's own
    socket again (with routing, retries and metrics) and its body is copied into this response."""
    host, port = request.transport.get_extra_info("sockname")[:2]  # type: ignore[union-attr]  # still connected
    host = f"[{host}]" if ":" in host else host
    headers = {k: v for k, v in request.headers.items() if k.lower() not in _NOT_COPIED}
    headers[HELD_HEADER] = "1"
    async with session.post(f"http://{host}:{port}{request.path_qs}", data=await request.read(),
                            headers=headers, timeout=aiohttp.ClientTimeout(total=None)) as upstream:
        if upstream.status != 200:
            body = await upstream.read()
            try:
                message = json.loads(body)["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = body.decode(errors="replace")[:500]
            await response.write(sse_error_event(message, upstream.status))
            return
        async for chunk in upstream.content.iter_any():
            await response.write(chunk)
