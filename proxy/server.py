"""The proxy's HTTP server: the bounds aiohttp's server does not set by itself.

- **Connections per client.** A client (an IPv4 address, or an IPv6 /64) past
  `max_connections_per_client` open connections has each new one closed at once, before a byte
  of it is read, so no one client can take every file descriptor.
- **Header timeout.** A request's headers must be complete `header_timeout_s` after the
  connection opened, or after the first byte of a later request on it; otherwise 408 and the
  connection is closed (a slowloris dribbling header bytes cannot hold it). API keys cannot help
  here: they are read from the headers.
- **Body timeout.** A request's body must be complete `body_timeout_s` after its headers; a
  handler still reading it then gets a 408 `ProxyError` from the read, and the connection closes
  after that answer.
- **Shutdown with one deadline.** In-flight requests get `shutdown_grace_s` in all from the
  start of shutdown (aiohttp waits that long, then as long again after cancelling, rounding each
  up). Whatever still runs then is cut: an event stream gets a final error event and
  `data: [DONE]`, a request not yet answered gets 503.

aiohttp has no public hooks for these, so this module reads and sets some of its private
attributes (`AIOHTTP_INTERNALS`), checked against aiohttp 3.13 and 3.14; pyproject.toml allows
only that range. `ProxyRunner` refuses to start on an aiohttp that lacks any of them, and
tests/proxy/test_server.py fails naming them, so an upgrade breaks a test, not the protection.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import logging
import platform
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest
from aiohttp.web_server import Server

from proxy.errors import ProxyError, ThrottledWarning, error_body, error_response, sse_error_event
from proxy.http_errors import JsonErrorRequestHandler
from proxy.limits import LimitsConfig
from proxy.ratelimit import client_id

if TYPE_CHECKING:
    from proxy.fastpath import FastPath, FrontProtocol

log = logging.getLogger(__name__)
over_cap_warning = ThrottledWarning(log)

CUT_WAIT_S = 1.0
"""After the grace, how long a cut request gets to write its last words (error event or 503)."""
CUT_MESSAGE = "The proxy shut down before this request finished; the answer is incomplete."
AIOHTTP_INTERNALS = {
    "RequestHandler": ("_request_count", "_messages", "_request_in_progress", "_task_handler", "_lingering_time",
                       "_keepalive_handle", "_loop"),
    "Server": ("_kwargs", "_connections", "_loop"),
    "AppRunner": ("_make_server", "_server"),
}
"""aiohttp's private attributes this module relies on, by the class that has them (the behaviour
behind them is held by the socket tests of tests/proxy/test_server.py)."""


class ConnectionCounter:
    """Open connections per client; `cap` 0 means no cap."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.open: dict[str, int] = {}

    def admit(self, client: str) -> bool:
        n = self.open.get(client, 0)
        if self.cap and n >= self.cap:
            return False
        self.open[client] = n + 1
        return True

    def release(self, client: str) -> None:
        n = self.open.get(client, 0) - 1
        if n > 0:
            self.open[client] = n
        else:
            self.open.pop(client, None)


def peer_address(transport: asyncio.BaseTransport) -> str | None:
    peer = transport.get_extra_info("peername")
    return peer[0] if isinstance(peer, tuple) else None


def admit(counter: ConnectionCounter, transport: asyncio.BaseTransport) -> str | None:
    """Count a new connection against its client's cap: the client's id, or None (the
    connection is closed, unread) when the client is at its cap."""
    client = client_id(peer_address(transport))
    if counter.admit(client):
        return client
    over_cap_warning.warning(f"client {client} is at its {counter.cap} connections; "
                             f"new ones are closed (--max-connections-per-client)")
    transport.close()
    return None


def timeout_response(message: str) -> bytes:
    """A whole 408 answer, written on the transport when no request object exists yet."""
    body = json.dumps(error_body(408, message)).encode()
    head = (f"HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    return head + body


class GuardedRequestHandler(JsonErrorRequestHandler):
    """One client connection: counted against its client's cap, headers under a deadline, and
    shut down by the server's one deadline."""

    def __init__(self, manager: GuardedServer, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self.server = manager
        self.client = ""
        self.admitted = False
        self.head_timer: asyncio.TimerHandle | None = None
        self.body_timer: asyncio.TimerHandle | None = None
        self.head_started = False
        """Bytes of a request head (other than stray CRLFs) arrived and it is not complete yet."""
        self.last_payload: Any = None
        """The body stream of the last request whose head arrived (None before the first)."""
        self.cut_by_shutdown = False
        self.prepared: tuple[BaseRequest, web.StreamResponse] | None = None
        """The request whose response headers went out last, with that response."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        client = admit(self.server.counter, transport)
        if client is None:
            return
        self.client, self.admitted = client, True
        super().connection_made(transport)
        self._arm_head_timer()

    def connection_lost(self, exc: BaseException | None) -> None:
        if not self.admitted:
            return
        self.admitted = False
        self.server.counter.release(self.client)
        self._disarm_head_timer()
        if self.body_timer is not None:
            self.body_timer.cancel()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if not self.admitted:
            return
        heads = self._request_count
        super().data_received(data)
        if self._request_count > heads:  # a head is complete: its request is under way
            self.head_started = False
            self._disarm_head_timer()
            self.last_payload = self._messages[-1][1] if self._messages else None
            if not self._awaiting_head():
                self._arm_body_timer(self.last_payload)
        elif data.strip(b"\r\n") and self._awaiting_head():
            self.head_started = True
            if self.head_timer is None:
                self._arm_head_timer()

    def _awaiting_head(self) -> bool:
        return self.last_payload is None or self.last_payload.is_eof()

    def _arm_head_timer(self) -> None:
        self.head_timer = self._loop.call_later(self.server.limits.header_timeout_s, self._head_timed_out)

    def _disarm_head_timer(self) -> None:
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None

    def _arm_body_timer(self, payload: Any) -> None:
        if self.body_timer is not None:
            self.body_timer.cancel()
        self.body_timer = self._loop.call_later(self.server.limits.body_timeout_s, self._body_timed_out, payload)

    def _body_timed_out(self, payload: Any) -> None:
        self.body_timer = None
        if payload.is_eof() or payload is not self.last_payload or not self._request_in_progress:
            return  # complete, or its handler is done (aiohttp's lingering close bounds the rest)
        timeout_s = self.server.limits.body_timeout_s
        payload.set_exception(ProxyError(408, f"The request body did not arrive within {timeout_s:g} s."))
        # No keep-alive after the 408, and no lingering read of the rest: it would meet the
        # exception just set and log it as unhandled.
        self._lingering_time = 0.0
        self.close()

    def _head_timed_out(self) -> None:
        self.head_timer = None
        if self.transport is None:
            return
        if self._request_in_progress:
            # The head that started is pipelined behind a request being answered (or stray bytes
            # after its body): judge it once that answer is done.
            self._arm_head_timer()
            return
        if self.head_started:
            self.transport.write(timeout_response(
                f"The request headers did not arrive within {self.server.limits.header_timeout_s:g} s."))
        self.force_close()

    async def shutdown(self, timeout: float | None = 15.0) -> None:
        """Let the request in flight finish for up to `timeout`, then cut it (see the module)."""
        if self._keepalive_handle is not None:
            self._keepalive_handle.cancel()
        self._disarm_head_timer()
        task = self._task_handler
        if task is not None and not task.done():
            done, _ = await asyncio.wait({task}, timeout=max(0.0, timeout or 0.0))
            if not done:
                self.cut_by_shutdown = True
                task.cancel()
                await asyncio.wait({task}, timeout=CUT_WAIT_S)
        self.force_close()


class GuardedServer(Server):
    """aiohttp's low-level server whose connections start on the fast path (proxy/fastpath.py)
    and are handed to a `GuardedRequestHandler` for whatever the fast path does not serve."""

    limits: LimitsConfig
    counter: ConnectionCounter
    fast: FastPath | None = None
    fronts: set[FrontProtocol]
    deadline: float | None = None
    """Loop time by which shutdown cuts what still runs (set when shutdown starts)."""

    def __call__(self) -> asyncio.Protocol:  # type: ignore[override]  # a FrontProtocol until handed over
        if self.fast is None:
            return self.guarded_handler()
        return self.fast.protocol(self)

    def guarded_handler(self) -> GuardedRequestHandler:
        return GuardedRequestHandler(self, loop=self._loop, **self._kwargs)

    def pre_shutdown(self) -> None:
        for front in list(self.fronts):
            front.close_if_idle()
        super().pre_shutdown()

    async def shutdown(self, timeout: float | None = None) -> None:
        if self.deadline is not None:
            timeout = self.deadline - self._loop.time()
        await asyncio.gather(*(conn.shutdown(timeout) for conn in list(self._connections)),
                             *(front.shutdown(timeout or 0.0) for front in list(self.fronts)))
        self._connections.clear()
        if self.fast is not None:
            self.fast.close()


def missing_aiohttp_internals(runner: web.AppRunner, server: Server) -> list[str]:
    """`Class.attribute` for each of AIOHTTP_INTERNALS that this aiohttp lacks ([] on the versions
    pyproject.toml allows); `server` is `runner`'s, and a connection handler is made to look."""
    try:
        handler: object = RequestHandler(server, loop=asyncio.get_running_loop())
    except TypeError as exc:  # its constructor changed: nothing of it can be trusted
        return [f"RequestHandler(manager, loop=...): {exc}"]
    have = {"RequestHandler": handler, "Server": server, "AppRunner": runner}
    return [f"{cls}.{name}" for cls, names in AIOHTTP_INTERNALS.items() for name in names
            if not hasattr(have[cls], name)]


class ProxyRunner(web.AppRunner):
    """An AppRunner whose server guards connections (see the module) and answers protocol errors
    as OpenAI-style JSON."""

    def __init__(self, app: web.Application, limits: LimitsConfig, fast_path: bool = False, **kwargs: Any) -> None:
        super().__init__(app, shutdown_timeout=limits.shutdown_grace_s,
                         keepalive_timeout=limits.keepalive_timeout_s, **kwargs)
        self.limits = limits
        self.fast_path = fast_path
        # The cut needs the response a handler prepared, and a place around every handler.
        app.on_response_prepare.append(_remember_prepared)
        app.middlewares.insert(0, cut_middleware)

    async def _make_server(self) -> Server:
        server = await super()._make_server()
        missing = missing_aiohttp_internals(self, server)
        if missing:  # the guards would fail on the first connection, or silently: refuse to start
            raise RuntimeError(f"aiohttp {aiohttp.__version__} lacks {', '.join(missing)}, which the proxy's "
                               f"connection guards (proxy/server.py) need; install the aiohttp pyproject.toml allows")
        server.__class__ = GuardedServer  # same state, our handler factory and shutdown
        assert isinstance(server, GuardedServer)
        server.limits = self.limits
        server.counter = ConnectionCounter(self.limits.max_connections_per_client)
        server.fronts = set()
        if self.fast_path:
            from proxy.fastpath import FastPath  # proxy/dispatch.py, which it uses, imports this module

            server.fast = FastPath(self.app)
        return server

    async def cleanup(self) -> None:
        server = self._server
        if isinstance(server, GuardedServer):
            server.deadline = asyncio.get_running_loop().time() + self.limits.shutdown_grace_s
        await super().cleanup()


def cut_by_shutdown(request: BaseRequest) -> bool:
    """Shutdown cut this request at the end of the grace (its handler's cancellation is not its
    client leaving: the client gets a last word, a final error event or a 503)."""
    protocol = request.protocol
    return isinstance(protocol, GuardedRequestHandler) and protocol.cut_by_shutdown


async def _remember_prepared(request: BaseRequest, response: web.StreamResponse) -> None:
    if isinstance(request.protocol, GuardedRequestHandler):
        request.protocol.prepared = (request, response)


@web.middleware
async def cut_middleware(request: web.Request,
                         handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
    """Last words for a request that shutdown cut (and only for those: a client that left has no
    connection to write to)."""
    try:
        return await handler(request)
    except asyncio.CancelledError:
        if not cut_by_shutdown(request):
            raise
        protocol = request.protocol
        assert isinstance(protocol, GuardedRequestHandler)  # cut_by_shutdown says so
        prepared = protocol.prepared[1] if protocol.prepared and protocol.prepared[0] is request else None
        if prepared is None:  # nothing went out yet: a whole answer
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            return error_response(ProxyError(503, CUT_MESSAGE, headers={"Retry-After": "1"}),
                                  {"x-flotilla-backend": ""})
        if prepared.content_type == "text/event-stream":
            await _end_cut_stream(prepared)
        raise


async def _end_cut_stream(response: web.StreamResponse) -> None:
    # The leading blank line closes an event the cut left half-written, so the error event
    # parses on its own (a blank line after a complete event is ignored by SSE parsers).
    try:
        await response.write(b"\n\n" + sse_error_event(CUT_MESSAGE, 503))
        await response.write_eof()
    except (ConnectionError, RuntimeError):
        pass



# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def keep_freed_heap(mmap_threshold: int = 32 << 20, trim_threshold: int = 64 << 20) -> bool:
    """Have glibc's malloc serve blocks up to `mmap_threshold` from the heap and keep up to
    `trim_threshold` of freed heap instead of handing it back to the kernel.

    A long prompt is held a few times over while it is read, joined, parsed and hashed, each copy
    a few hundred KB. By default malloc maps such blocks fresh and gives the freed top of the heap
    back, so every request faults its pages in again: for a 400,000-character prompt that was
    about 1 ms of the proxy's 1.5 ms (`bench.overhead --long-prompt`). Kept, they are reused.
    The cost is up to `trim_threshold` of freed memory held after a burst of long prompts.
    Returns whether malloc took the settings (only glibc's does)."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, mmap_threshold)) and bool(mallopt(_M_TRIM_THRESHOLD, trim_threshold))


def raise_open_file_limit(ceiling: int = 1 << 20) -> int:
    """Lift the soft limit on open files to the hard one (as Go's runtime does at start), so the
    per-client cap, not a default soft limit of 1,024, bounds how many clients are served.
    Returns the soft limit in force."""
    try:
        import resource
    except ImportError:  # not on this platform
        return -1
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = ceiling if hard == resource.RLIM_INFINITY else min(hard, ceiling)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass  # keep the limit we have
    return soft
