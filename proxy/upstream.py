"""The request path's HTTP/1.1 client: keep-alive connections per backend, each response parsed
by httptools (llhttp, the parser Node.js uses) as its bytes arrive and handed on as a head, body
chunks and an end, with no per-chunk task, future or copy.

aiohttp's client builds a request object, a response object, a stream reader and a timer per
request; on the proxy's request path that was most of a millisecond (docs/benchmarks.md). This
client does only what forwarding needs: send the bytes it is given, parse the answer, put the
connection back when the engine keeps it alive. Which backend, timeouts and retries stay with the
caller (proxy/fastpath.py).
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import urlsplit

import httptools

from proxy.records import ResponseHead

READ = frozenset({b"content-type", b"content-length", b"transfer-encoding", b"retry-after", b"connection"})
"""The response fields the head reads (the others it only relays)."""


class ResponseSink(Protocol):
    """Where one response goes as it arrives (proxy/fastpath.py's attempt)."""

    def on_head(self, head: ResponseHead) -> None: ...

    def on_body(self, chunk: bytes) -> None: ...

    def on_end(self) -> None: ...

    def on_lost(self, reason: str) -> None:
        """The connection broke (or spoke no HTTP) before the response's end."""


@dataclass(frozen=True, slots=True)
class Target:
    """Where a backend's requests go: its address and the head fields that depend on it."""

    host: str
    port: int
    tls: bool
    base_path: str
    """A path the backend URL carries before the route (usually empty)."""
    host_header: bytes
    key: tuple[str, int, bool]
    """(host, port, tls): which idle connections serve it (a field: read on every request)."""


def target_of(url: str) -> Target:
    parts = urlsplit(url)
    tls = parts.scheme == "https"
    host = parts.hostname or "127.0.0.1"
    port = parts.port or (443 if tls else 80)
    netloc = f"[{host}]" if ":" in host else host
    default_port = 443 if tls else 80
    host_header = netloc if parts.port in (None, default_port) else f"{netloc}:{port}"
    return Target(host, port, tls, parts.path.rstrip("/"), host_header.encode("idna"), (host, port, tls))


def set_nodelay(transport: asyncio.BaseTransport) -> None:
    """No Nagle delay: a small write (an answer's head, one event) leaves at once (uvloop and
    asyncio set it too; this does not depend on their defaults)."""
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class UpstreamConnection(asyncio.Protocol):
    """One keep-alive connection to one backend; one response at a time."""

    def __init__(self, pool: UpstreamPool, key: tuple[str, int, bool]) -> None:
        self.pool = pool
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.sink: ResponseSink | None = None
        self.head: ResponseHead | None = None
        self._reason = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._informational = False
        self.closed = False

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is one, not a subclass
        set_nodelay(transport)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError:
            self.abort()  # a sink's bug: never reuse this connection
        except httptools.HttpParserError:
            self._lose("protocol")
            self.abort()

    def eof_received(self) -> bool:
        return False  # close our side too

    def connection_lost(self, exc: BaseException | None) -> None:
        self.closed = True
        self.pool.forget(self)
        head = self.head
        if head is not None and self.sink is not None and head.content_length is None and not head.chunked:
            self._end()  # a body delimited by the connection's close (RFC 9112 6.3, last rule)
        else:
            self._lose("disconnect")

    # httptools callbacks

    def on_message_begin(self) -> None:
        self._reason = b""
        self._headers = []

    def on_status(self, reason: bytes) -> None:
        self._reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if 100 <= status < 200:  # informational (100 Continue): the answer is still to come
            self._informational = True
            return
        head = ResponseHead(status, self._reason.decode("latin-1"), self._headers)
        relayed, not_relayed = head.relayed, self.pool.not_relayed
        for name, value in self._headers:
            lname = name.lower()
            if lname not in not_relayed:
                relayed.append((name, value))
            if lname not in READ:
                continue
            if lname == b"content-type":
                head.content_type = value.split(b";", 1)[0].strip().lower().decode("latin-1")
                head.event_stream = head.content_type == "text/event-stream"
            elif lname == b"content-length":
                head.content_length = int(value) if value.strip().isdigit() else None
            elif lname == b"transfer-encoding":
                head.chunked = b"chunked" in value.lower()
            elif lname == b"retry-after":
                if head.retry_after is None:
                    head.retry_after = value.decode("latin-1")
            else:  # connection: every Connection field's options count (RFC 9110 7.6.1)
                text = value.decode("latin-1")
                head.connection = f"{head.connection}, {text}" if head.connection else text
        self.head = head
        if self.sink is not None:
            self.sink.on_head(head)

    def on_body(self, body: bytes) -> None:
        if self.sink is not None:
            self.sink.on_body(body)

    def on_message_complete(self) -> None:
        if self._informational:
            self._informational = False
            return
        keep = self.parser.should_keep_alive()
        self._end()
        if keep and not self.closed:
            self.pool.put_back(self)
        else:
            self.close()

    # the caller's side

    def send(self, head: bytes, body: bytes, sink: ResponseSink) -> None:
        """Send a request (its head and body in one vectored write: a long prompt is not copied
        again) and hand its response to `sink`."""
        self.sink = sink
        self.head = None
        assert self.transport is not None
        self.transport.writelines((head, body))

    def pause_reading(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()

    def abort(self) -> None:
        """Drop the connection at once: how an engine learns that its client went away."""
        self.sink = None
        self.closed = True
        self.pool.forget(self)
        if self.transport is not None:
            self.transport.abort()

    def close(self) -> None:
        self.closed = True
        self.pool.forget(self)
        if self.transport is not None:
            self.transport.close()

    def _end(self) -> None:
        sink, self.sink, self.head = self.sink, None, None
        if sink is not None:
            sink.on_end()

    def _lose(self, reason: str) -> None:
        sink, self.sink, self.head = self.sink, None, None
        if sink is not None:
            sink.on_lost(reason)


@dataclass
class UpstreamPool:
    """Idle keep-alive connections per backend address, newest first."""

    idle: dict[tuple[str, int, bool], list[UpstreamConnection]] = field(default_factory=dict)
    not_relayed: frozenset[bytes] = frozenset()
    """Lower-case response fields the caller never relays (`ResponseHead.relayed` leaves them out)."""
    tls_context: Callable[[], ssl.SSLContext] = ssl.create_default_context
    _tls: ssl.SSLContext | None = None

    def take_idle(self, target: Target) -> UpstreamConnection | None:
        conns = self.idle.get(target.key)
        while conns:
            conn = conns.pop()
            if not conn.closed and conn.transport is not None and not conn.transport.is_closing():
                return conn
        return None

    async def connect(self, target: Target) -> UpstreamConnection:
        """A new connection (the caller bounds the wait). OSError when it cannot be made."""
        loop = asyncio.get_running_loop()
        if target.tls and self._tls is None:
            self._tls = self.tls_context()
        _, conn = await loop.create_connection(lambda: UpstreamConnection(self, target.key), target.host,
                                               target.port, ssl=self._tls if target.tls else None)
        return conn

    def put_back(self, conn: UpstreamConnection) -> None:
        self.idle.setdefault(conn.key, []).append(conn)

    def forget(self, conn: UpstreamConnection) -> None:
        conns = self.idle.get(conn.key)
        if conns and conn in conns:
            conns.remove(conn)

    def close(self) -> None:
        for conns in list(self.idle.values()):
            for conn in list(conns):
                conn.close()
        self.idle.clear()
