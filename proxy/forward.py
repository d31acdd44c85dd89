"""Forwarding one attempt to one backend, and relaying its body chunk by chunk.

`open_upstream` sends the request and waits for the response headers; any failure there is an
`UpstreamFailure` that the caller may retry elsewhere, since nothing reached the client yet.
`relay` copies the body as it arrives (never buffering or merging chunks); once it starts,
failures end the client's stream with an error event instead of a retry.

The two legs have their own timeouts: the backend's silence (idle, total) is the backend's
fault; a client that stops taking the response (`client_write_s`) is the client's, and ends
only that client's connection and the engine's work for it.
"""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import Mapping

import aiohttp
import msgspec
from aiohttp import web
from multidict import CIMultiDict

from proxy.config import TimeoutConfig
from proxy.errors import speaks_anthropic, sse_error_event
from proxy.usage import TAIL_BYTES, UsageEventFilter

HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection", "te",
    "trailer", "trailers", "transfer-encoding", "upgrade",
})
NOT_FORWARDED_UP = HOP_BY_HOP | {"host", "content-length", "content-encoding", "x-flotilla-debug"}
"""Content-Encoding too: the proxy forwards the body decoded (proxy/body.py)."""
NOT_FORWARDED_DOWN = HOP_BY_HOP | {"content-length", "server", "date"}


class _Ids:
    """Request ids from a generator seeded from the OS once per process (and again in a forked
    child, so workers never share a sequence): no system call per request, as os.urandom makes."""

    def __init__(self) -> None:
        self.reseed()
        os.register_at_fork(after_in_child=self.reseed)

    def reseed(self) -> None:
        self.rng = random.Random(os.urandom(32))

    def next(self) -> str:
        return f"{self.rng.getrandbits(128):032x}"


_IDS = _Ids()


def new_request_id() -> str:
    """An X-Request-Id for a request that came without one: 128 random bits in hex (uuid4's
    length, without building a UUID object or making a system call on the request path)."""
    return _IDS.next()


class UpstreamFailure(Exception):
    """An attempt that failed before any byte reached the client."""

    def __init__(self, reason: str, retryable: bool, status: int = 502) -> None:
        super().__init__(reason)
        self.reason = reason
        """connect, disconnect, first_byte_timeout, total_timeout: label of the retry metric."""
        self.retryable = retryable
        self.status = status
        """Status to answer with when no attempt is left."""


class RelayResult(msgspec.Struct):
    """How a relayed body ended."""

    completed: bool
    """The backend's body was copied to the end."""
    client_gone: bool = False
    cut_by_shutdown: bool = False
    """The proxy's shutdown cut it at the end of the grace (not the client's doing nor the backend's)."""
    client_stalled: bool = False
    """The client stopped taking the response for `client_write_s` (its connection is dropped)."""
    error: str | None = None
    """Why the upstream body broke off, when it did."""
    first_byte_at_s: float | None = None
    """Loop time at which the first body chunk was written to the client."""
    tail: bytes = b""
    """The last TAIL_BYTES of the body (where a stream's usage chunk is)."""
    body: bytes | None = None
    """The whole body when it was small JSON (for usage)."""


def _connection_listed(headers: Mapping[str, str]) -> set[str]:
    """Headers the sender marked hop-by-hop by naming them in Connection (RFC 9110 7.6.1)."""
    return {t.strip().lower() for t in headers.get("Connection", "").split(",") if t.strip()}


def upstream_headers(headers: Mapping[str, str], request_id: str, drop_authorization: bool) -> CIMultiDict[str]:
    """The client's end-to-end headers for the engine; `drop_authorization` when the client's
    Authorization (or x-api-key) is its key to the proxy, which no backend is to see."""
    out: CIMultiDict[str] = CIMultiDict()
    drop = NOT_FORWARDED_UP | _connection_listed(headers)
    if drop_authorization:
        drop = drop | {"authorization", "x-api-key"}
    for name, value in headers.items():
        if name.lower() not in drop:
            out.add(name, value)
    out["X-Request-Id"] = request_id
    return out


def with_credentials(headers: CIMultiDict[str], authorization: str | None) -> CIMultiDict[str]:
    """`headers` with the backend's own Authorization in place of the client's, when it has one."""
    if authorization is None:
        return headers
    out = headers.copy()
    out["Authorization"] = authorization
    return out


def downstream_headers(headers: Mapping[str, str]) -> CIMultiDict[str]:
    out: CIMultiDict[str] = CIMultiDict()
    drop = NOT_FORWARDED_DOWN | _connection_listed(headers)
    for name, value in headers.items():
        if name.lower() not in drop:
            out.add(name, value)
    return out


def client_timeout(t: TimeoutConfig) -> aiohttp.ClientTimeout:
    # Only the connect phase is left to aiohttp; first byte, idle gaps and the total are
    # enforced around each await so each has its own limit.
    return aiohttp.ClientTimeout(total=None, connect=None, sock_connect=t.connect_s, sock_read=None)


async def open_upstream(session: aiohttp.ClientSession, method: str, url: str,
                        headers: Mapping[str, str], body: bytes, timeouts: TimeoutConfig,
                        deadline: float) -> aiohttp.ClientResponse:
    """Send one attempt; return once the response headers are in."""
    loop = asyncio.get_running_loop()
    first_byte_deadline = min(deadline, loop.time() + timeouts.first_byte_s)
    try:
        async with asyncio.timeout_at(first_byte_deadline):
            return await session.request(method, url, headers=headers, data=body,
                                         timeout=client_timeout(timeouts), allow_redirects=False)
    except aiohttp.ClientConnectorError as exc:  # refused, unreachable, connect timeout
        raise UpstreamFailure("connect", retryable=True) from exc
    except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
        raise UpstreamFailure("disconnect", retryable=True) from exc
    except aiohttp.ServerTimeoutError as exc:
        raise UpstreamFailure("connect", retryable=True, status=504) from exc
    except TimeoutError as exc:
        reason = "total_timeout" if first_byte_deadline == deadline else "first_byte_timeout"
        raise UpstreamFailure(reason, retryable=False, status=504) from exc
    except aiohttp.ClientError as exc:
        raise UpstreamFailure("protocol", retryable=False) from exc


def is_event_stream(resp: aiohttp.ClientResponse) -> bool:
    return resp.content_type == "text/event-stream"


WHOLE_BODY_MAX_BYTES = 1 << 20
"""A non-stream body of known length up to this is read whole and sent in one write."""


def is_small_whole_body(resp: aiohttp.ClientResponse) -> bool:
    """A sized, non-stream body: it reaches the client only complete whatever the proxy does, so
    reading it first costs no latency and saves a write per response."""
    length = resp.content_length
    return length is not None and length <= WHOLE_BODY_MAX_BYTES and not is_event_stream(resp)


async def read_whole(upstream: aiohttp.ClientResponse, timeouts: TimeoutConfig, deadline: float) -> RelayResult:
    """Read a small sized body (see `is_small_whole_body`) under the idle and total timeouts."""
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout_at(min(deadline, loop.time() + timeouts.idle_s)):
            body = await upstream.read()
    except TimeoutError:
        return RelayResult(completed=False, error="the backend stopped sending (idle or total timeout)")
    except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as exc:
        return RelayResult(completed=False, error=f"the backend connection broke mid-response: {type(exc).__name__}")
    return RelayResult(completed=True, first_byte_at_s=loop.time(), tail=body[-TAIL_BYTES:], body=body)


async def relay(request: web.Request, response: web.StreamResponse, upstream: aiohttp.ClientResponse,
                timeouts: TimeoutConfig, deadline: float, keep_json: bool,
                strip_usage: bool = False) -> RelayResult:
    """Copy `upstream`'s body to the prepared `response` chunk by chunk (less the usage event
    when `strip_usage`: the proxy asked for it, the client did not)."""
    loop = asyncio.get_running_loop()
    result = RelayResult(completed=False)
    body = bytearray() if keep_json and not is_event_stream(upstream) else None
    usage_filter = UsageEventFilter() if strip_usage else None
    tail = b""
    writing = False
    try:
        # One timeout, moved before each await: to the backend's deadline while reading, to the
        # client's while writing, so a stall is blamed on the side that stalled.
        async with asyncio.timeout(None) as cm:
            while True:
                writing = False
                cm.reschedule(min(deadline, loop.time() + timeouts.idle_s))
                try:
                    chunk = await upstream.content.readany()
                except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as exc:
                    result.error = f"the backend connection broke mid-response: {type(exc).__name__}"
                    break
                tail = (tail + chunk)[-TAIL_BYTES:] if chunk else tail
                out = chunk if usage_filter is None else (
                    usage_filter.feed(chunk) if chunk else usage_filter.flush())
                writing = True
                cm.reschedule(loop.time() + timeouts.client_write_s)
                try:
                    if out:
                        await response.write(out)
                except ConnectionResetError:
                    result.client_gone = True
                    break
                if not chunk:
                    result.completed = True
                    break
                if result.first_byte_at_s is None and out:
                    result.first_byte_at_s = loop.time()
                if body is not None and len(body) < 1 << 20:
                    body += chunk
    except TimeoutError:
        if writing:
            result.client_stalled = result.client_gone = True
        else:
            result.error = "the backend stopped sending (idle or total timeout)"
    result.tail = tail
    result.body = bytes(body) if body is not None else None
    return result


async def send_whole(request: web.Request, response: web.StreamResponse, timeouts: TimeoutConfig) -> RelayResult:
    """Finish sending `response` (prepared or not) within `client_write_s`; says whether the client
    took it."""
    result = RelayResult(completed=True)
    try:
        async with asyncio.timeout(timeouts.client_write_s):
            await response.prepare(request)
            await response.write_eof()
    except TimeoutError:
        result.client_stalled = result.client_gone = True
    except ConnectionResetError:
        result.client_gone = True
    return result


def drop_client(request: web.Request) -> None:
    """Drop a client that stopped reading: abort, since a close would wait for it to read."""
    if request.transport is not None:
        request.transport.abort()


async def end_broken_stream(request: web.Request, response: web.StreamResponse,
                            upstream: aiohttp.ClientResponse, result: RelayResult,
                            timeouts: TimeoutConfig) -> None:
    """An event stream gets an error event and [DONE]; other bodies are cut off."""
    if is_event_stream(upstream):
        # Close a half-written event first so the error event parses on its own.
        sep = b"" if not result.tail or result.tail.endswith((b"\n\n", b"\r\n\r\n")) else b"\n\n"
        try:
            async with asyncio.timeout(timeouts.client_write_s):
                await response.write(sep + sse_error_event(result.error or "upstream failure",
                                                           anthropic=speaks_anthropic(request.path)))
                await response.write_eof()
        except ConnectionResetError:
            pass
        except TimeoutError:
            drop_client(request)
    elif request.transport is not None:
        request.transport.close()
