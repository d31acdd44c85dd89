"""The request path for completions and chat, on asyncio's protocols instead of aiohttp's objects.

Every client connection starts here (`FrontProtocol`): httptools parses the requests, the same
guards as proxy/server.py apply (connections per client, header, body and keep-alive timeouts, the
body limit, head size limits), and `POST /v1/completions` and `POST /v1/chat/completions` are served
by `FastPath`: the same reading of the body (`generation_forward`), access check, admission slot,
P/D prefill phase, router, reservations, retries before the first byte, circuit breaker, metrics
and usage accounting as proxy/dispatch.py, but the engine is spoken to through proxy/upstream.py
and its answer is written to the client's transport as it arrives: no request, response or
stream-reader objects, no task per chunk.

Everything else (other routes, `x-flotilla-debug`, compressed bodies, HTTP/1.0, a proxy with
middleware the fast path does not run, such as the autoscaler's hold) goes to the aiohttp
application: the connection is handed over, its parsed requests written again as bytes, and stays
with aiohttp from then on. `--no-fast-path` hands every connection over at once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import deque
from collections.abc import Awaitable, Iterator, Mapping
from email.utils import formatdate
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

import httptools
from multidict import CIMultiDict

from policies.routing.base import Decision
from proxy.app import PROXY_KEY, Proxy, errors_middleware, with_prefill
from proxy.dispatch import MAX_ERROR_BODY_BYTES, Dispatcher, RetryableAnswer
from proxy.errors import ProxyError, ThrottledWarning, error_body, sse_error_event
from proxy.forward import (
    NOT_FORWARDED_DOWN,
    NOT_FORWARDED_UP,
    WHOLE_BODY_MAX_BYTES,
    RelayResult,
    UpstreamFailure,
    new_request_id,
)
from proxy.generation import generation_forward
from proxy.paths import canonical_path_middleware
from proxy.pool import Backend
from proxy.records import Forward, RequestStart, Reservation, ResponseHead
from proxy.request_parse import check_content_type, load_json_object
from proxy.server import (
    CUT_MESSAGE,
    CUT_WAIT_S,
    GuardedServer,
    _remember_prepared,
    admit,
    cut_middleware,
    peer_address,
)
from proxy.upstream import UpstreamConnection, UpstreamPool, set_nodelay, target_of
from proxy.usage import TAIL_BYTES, UsageEventFilter

if TYPE_CHECKING:
    from aiohttp import web

    from proxy.config import BackendSpec

log = logging.getLogger(__name__)
unexpected_warning = ThrottledWarning(log)

FAST_ROUTES = {b"/v1/completions": False, b"/v1/chat/completions": True}
NOTED = frozenset({b"content-length", b"expect", b"connection", b"content-encoding", b"x-flotilla-debug", b"upgrade"})
"""The routes the fast path serves, each with whether it is chat."""
MAX_URL_BYTES = 8190
MAX_FIELD_BYTES = 8190
MAX_HEAD_BYTES = 64 * 1024
MAX_HEADERS = 128
"""aiohttp's own bounds on a request head (line and field 8190 bytes), and a total."""
FIELD_WEIGHT = MAX_FIELD_BYTES // MAX_HEADERS + 1
"""What a field adds to a head's weight beyond its bytes: MAX_HEADERS of them outweigh a field's
limit, so one comparison per field stands for both."""
HEAD, BODY, IDLE = range(3)
"""What a connection waits for: a request's head, its body, or (kept alive) the next request."""
MAX_STARTS = 4096
"""`RequestStarts` keeps this many answers at most."""
OWN = {"x-flotilla-backend": ""}
"""The proxy's own answers name no backend, but still carry the header every response has."""


class Refused(Exception):
    """A request the front answers itself and then closes the connection (413, 414, 431)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class Incoming:
    """One request as parsed from the client. A plain class: one is made per request, and a
    dataclass's default factories cost a call each."""

    __slots__ = ("url", "headers", "head_weight", "body", "body_bytes", "method", "version", "keep_alive",
                 "first", "noted", "plain", "up")

    def __init__(self, headers: list[tuple[bytes, bytes]] | None = None) -> None:
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = [] if headers is None else headers
        self.head_weight = 0
        """The head's bytes so far, plus FIELD_WEIGHT - 4 per field (`on_header`'s one check of size)."""
        self.body: list[bytes] = []
        self.body_bytes = 0
        self.method = b""
        self.version = "1.1"
        self.keep_alive = True
        self.first: dict[bytes, bytes] = {}
        """The first value of each field, by lower-case name (what `ClientHeaders.get` reads)."""
        self.noted: dict[bytes, bytes] = {}
        """The last value of each header in NOTED, by lower-case name (read once, while parsing)."""
        self.plain = True
        """No header that sends the request to aiohttp (a coding, x-flotilla-debug, Upgrade)."""
        self.up: list[bytes] = []
        """The header lines for the engine, as they arrive: every field but those always dropped
        (a `Connection` header may name more: `FastPath.upstream_fields`)."""

    def header(self, name: bytes) -> bytes | None:
        return self.noted.get(name)

    def raw(self) -> bytes:
        """The request as bytes again (framed by Content-Length), for the aiohttp side."""
        lines = [self.method, b" ", self.url, b" HTTP/", self.version.encode(), b"\r\n"]
        for name, value in self.headers:
            if name.lower() not in (b"content-length", b"transfer-encoding", b"expect"):
                lines += [name, b": ", value, b"\r\n"]
        body = b"".join(self.body)
        if body or self.method not in (b"GET", b"HEAD"):
            lines.append(b"Content-Length: %d\r\n" % len(body))
        lines += [b"\r\n", body]
        return b"".join(lines)


_KEYS: dict[str, bytes] = {}
"""Field names asked of `ClientHeaders.get`, in lower-case bytes (the proxy's own names, a handful)."""


class ClientHeaders(Mapping[str, str]):
    """The client's headers as a case-insensitive mapping. The request path asks `get` for four
    or five fields by name, answered from `Incoming.first`; the CIMultiDict of all of them (every
    field decoded, 18k instructions a request) is made only when something reads more."""

    __slots__ = ("_req", "_all")

    def __init__(self, req: Incoming) -> None:
        self._req = req
        self._all: CIMultiDict[str] | None = None

    def get(self, name: str, default: Any = None) -> Any:
        key = _KEYS.get(name)
        if key is None:
            key = name.lower().encode("latin-1", "replace")
            if len(_KEYS) < 256:
                _KEYS[name] = key
        value = self._req.first.get(key)
        return default if value is None else value.decode("latin-1")

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.get(name) is not None

    def multidict(self) -> CIMultiDict[str]:
        if self._all is None:
            self._all = CIMultiDict([(n.decode("latin-1"), v.decode("latin-1")) for n, v in self._req.headers])
        return self._all

    def __getitem__(self, name: str) -> str:
        return self.multidict()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.multidict())

    def __len__(self) -> int:
        return len(self._req.headers)

    def items(self) -> Any:  # every field with its own value, repeated names too, as CIMultiDict gives
        return self.multidict().items()

    def keys(self) -> Any:
        return self.multidict().keys()

    def values(self) -> Any:
        return self.multidict().values()

    def getall(self, name: str, *default: Any) -> Any:
        return self.multidict().getall(name, *default)

    def getone(self, name: str, *default: Any) -> Any:
        return self.multidict().getone(name, *default)


def response_head(status: int, reason: str, fields: list[tuple[bytes, bytes]] | list[tuple[str, str]],
                  close: bool, lines: bytes = b"") -> bytes:
    """A response's head: `fields`, then header `lines` already formatted (each ending in CRLF)."""
    parts = [b"HTTP/1.1 %d %s\r\n" % (status, (reason or _phrase(status)).encode("latin-1", "replace")),
             header_lines(fields), lines]
    if close:
        parts.append(b"Connection: close\r\n")
    parts += [b"Date: ", http_date(), b"\r\n\r\n"]
    return b"".join(parts)


def header_lines(fields: list[tuple[bytes, bytes]] | list[tuple[str, str]]) -> bytes:
    parts = []
    for name, value in fields:
        n = name.encode("latin-1") if isinstance(name, str) else name
        v = value.encode("latin-1", "replace") if isinstance(value, str) else value
        parts += [n, b": ", v, b"\r\n"]
    return b"".join(parts)


_date: tuple[int, bytes] = (0, b"")


def http_date() -> bytes:
    """The Date header's value (RFC 9110 6.6.1, as aiohttp's server sends it), formatted once a
    second."""
    global _date
    now = int(time.time())
    if _date[0] != now:
        _date = (now, formatdate(now, usegmt=True).encode())
    return _date[1]


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


def error_bytes(exc: ProxyError, default_headers: dict[str, str], close: bool) -> bytes:
    body = json.dumps(error_body(exc.status, exc.message, exc.param, exc.code)).encode()
    headers = {**default_headers, **exc.headers, "Content-Type": "application/json",
               "Content-Length": str(len(body))}
    return response_head(exc.status, "", list(headers.items()), close) + body


class FrontProtocol(asyncio.Protocol):
    """One client connection: parse, guard, serve completions and chat, hand the rest over."""

    def __init__(self, server: GuardedServer, fast: FastPath) -> None:
        self.server = server
        self.fast = fast
        self.loop = server._loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        limits = server.limits
        # read on every request: kept here, not looked up through server.limits each time
        self.header_timeout_s, self.body_timeout_s = limits.header_timeout_s, limits.body_timeout_s
        self.keepalive_timeout_s = limits.keepalive_timeout_s
        self.max_body_bytes = fast.max_body_bytes
        self.drop_up = fast._drop_up
        self.client = ""
        self.remote: str | None = None
        self.admitted = False
        self.gone = False
        self.handed_over = False
        self.queue: deque[Incoming] = deque()
        self.cur: Incoming | None = None
        self.task: asyncio.Task | None = None
        self.attempt: Attempt | None = None
        """The attempt whose body is being relayed to this client (write flow control)."""
        self.head_wait: Attempt | None = None
        """The attempt waiting for its answer's head (its first-byte deadline, checked by the sweep)."""
        self.refused: Refused | None = None
        self.cut_by_shutdown = False
        self.deadline: float | None = None
        """Loop time by which `waiting_for` must have come (checked by `FastPath.sweep`)."""
        self.waiting_for = HEAD
        self.reading = True

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is one, not a subclass
        set_nodelay(transport)
        self.remote = peer_address(transport)
        client = admit(self.server.counter, transport)
        if client is None:
            return
        self.client, self.admitted = client, True
        self.server.fronts.add(self)
        if not self.fast.enabled():
            self.hand_over()
            return
        self._expect(HEAD, self.server.limits.header_timeout_s)
        self.fast.watch()

    def data_received(self, data: bytes) -> None:
        if self.handed_over or self.gone:
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._refuse(Refused(400, "Connection upgrades are not supported."))
            return
        except httptools.HttpParserCallbackError:
            self._refuse(self.refused or Refused(400, "Bad request."))
            return
        except httptools.HttpParserError as exc:
            log.debug("HTTP parse error from %s: %s", self.remote, exc)
            self._refuse(Refused(400, f"Bad request: {str(exc).splitlines()[0][:150]}"))
            return
        self._next()

    def connection_lost(self, exc: BaseException | None) -> None:
        self.gone = True
        self._disarm()
        if self.admitted and not self.handed_over:
            self.admitted = False
            self.server.counter.release(self.client)
            self.server.fronts.discard(self)
        if self.attempt is not None:
            self.attempt.client_left()
        if self.task is not None and not self.task.done():
            self.task.cancel()

    def pause_writing(self) -> None:
        if self.attempt is not None:
            self.attempt.client_paused()

    def resume_writing(self) -> None:
        if self.attempt is not None:
            self.attempt.client_resumed()

    # httptools callbacks

    def on_message_begin(self) -> None:
        self.cur = Incoming()
        if self.deadline is None or self.waiting_for == IDLE:  # the clock starts at the first byte
            self.waiting_for, self.deadline = HEAD, self.loop.time() + self.header_timeout_s

    def on_url(self, url: bytes) -> None:
        cur = self.cur
        assert cur is not None
        cur.url += url
        if len(cur.url) > MAX_URL_BYTES:
            self._raise(Refused(414, f"The request line is longer than {MAX_URL_BYTES} bytes."))

    def on_header(self, name: bytes, value: bytes) -> None:
        cur = self.cur
        assert cur is not None
        cur.headers.append((name, value))
        cur.head_weight += len(name) + len(value) + FIELD_WEIGHT
        lname = name.lower()
        cur.first.setdefault(lname, value)
        if lname not in self.drop_up:
            cur.up.append(b"".join((name, b": ", value, b"\r\n")))
        if lname in NOTED:
            cur.noted[lname] = value
            if lname in (b"x-flotilla-debug", b"upgrade") or (
                    lname == b"content-encoding" and value.strip().lower() not in (b"", b"identity")):
                cur.plain = False
        # Within one field's limit (each field weighing FIELD_WEIGHT more than its bytes) a head
        # has no field past it, nor too many fields: the full check runs past that weight.
        if cur.head_weight > MAX_FIELD_BYTES:
            count = len(cur.headers)
            if (len(name) > MAX_FIELD_BYTES or len(value) > MAX_FIELD_BYTES or count > MAX_HEADERS
                    or cur.head_weight - count * (FIELD_WEIGHT - 4) > MAX_HEAD_BYTES):
                self._raise(Refused(431, "The request headers are too large."))

    def on_headers_complete(self) -> None:
        cur = self.cur
        assert cur is not None
        cur.method = self.parser.get_method()
        cur.version = self.parser.get_http_version()
        cur.keep_alive = self.parser.should_keep_alive()
        noted = cur.noted
        length = noted.get(b"content-length")
        limit = self.max_body_bytes
        if length is not None and length.strip().isdigit() and int(length) > limit:
            self._raise(Refused(413, f"The request body is larger than {limit} bytes."))
        if b"expect" in noted:
            expect = noted[b"expect"]
            if expect.lower() == b"100-continue" and self.task is None and not self.queue:
                self.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        self.waiting_for, self.deadline = BODY, self.loop.time() + self.body_timeout_s

    def on_body(self, body: bytes) -> None:
        cur = self.cur
        assert cur is not None
        cur.body.append(body)
        cur.body_bytes += len(body)
        if cur.body_bytes > self.max_body_bytes:
            self._raise(Refused(413, f"The request body is larger than {self.max_body_bytes} bytes."))

    def on_message_complete(self) -> None:
        self.deadline = None
        assert self.cur is not None
        self.queue.append(self.cur)
        self.cur = None
        task = self.task
        # pipelined: one answer at a time, the rest wait in the socket. A task already done has
        # answered; only its done-callback (`_served`) is still to run, so reading goes on.
        if task is not None and self.reading and not task.done() and self.transport is not None:
            self.transport.pause_reading()
            self.reading = False

    # serving

    def _next(self) -> None:
        if self.task is not None or self.handed_over or self.gone:
            return
        if self.queue:
            req = self.queue[0]
            if not self.fast.serves(req):
                if self.cur is None:  # a request boundary: nothing of the next one is parsed yet
                    self.hand_over()
                else:
                    self._resume()
                return
            self.queue.popleft()
            self.task = self.loop.create_task(self.fast.serve(self, req))
            self.task.add_done_callback(self._served)
            return
        self._resume()

    def _served(self, task: asyncio.Task) -> None:
        self.task = None
        self.attempt = None
        try:
            keep = task.result()
        except BaseException:  # cancelled, or an error serve() let through: the connection ends
            keep = False
        if self.gone:
            return
        if not keep:
            self.close()
            return
        if self.queue or self.cur is not None:
            self._next()
            return
        self.waiting_for, self.deadline = IDLE, self.loop.time() + self.keepalive_timeout_s
        self._resume()

    def _resume(self) -> None:
        if not self.reading and self.transport is not None and not self.gone:
            self.transport.resume_reading()
            self.reading = True

    def hand_over(self) -> None:
        """Give this connection, with the requests parsed and not answered, to aiohttp's server."""
        assert self.transport is not None
        data = b"".join(req.raw() for req in self.queue)
        self.queue.clear()
        self._disarm()
        self.handed_over = True
        self.server.fronts.discard(self)
        if self.admitted:
            self.admitted = False
            self.server.counter.release(self.client)
        handler = self.server.guarded_handler()
        transport = self.transport
        transport.set_protocol(handler)
        handler.connection_made(transport)
        if data and not transport.is_closing():
            handler.data_received(data)
        if not self.reading:
            transport.resume_reading()

    # writing

    def write(self, data: bytes) -> None:
        if not self.gone and self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def close(self) -> None:
        self._disarm()
        if self.transport is not None and not self.handed_over:
            self.transport.close()

    def abort(self) -> None:
        if self.transport is not None and not self.handed_over:
            self.transport.abort()

    def _own(self) -> dict[str, str]:
        """The headers of the proxy's own answers: no backend named, and the static ones."""
        return {**OWN, **dict(self.fast._static)}

    def _raise(self, refused: Refused) -> None:
        self.refused = refused
        raise refused

    def _refuse(self, refused: Refused) -> None:
        """Answer a request the front will not take, then close (it may still be sending)."""
        self.queue.clear()
        if self.task is None:
            self.write(error_bytes(ProxyError(refused.status, refused.message), self._own(), close=True))
            self.close()
        else:  # an answer is on its way: let it finish, then close
            self.refused = refused
            self.task.add_done_callback(lambda _t: self.close())
            if self.transport is not None and self.reading:
                self.transport.pause_reading()
                self.reading = False

    # deadlines: one per connection, checked by FastPath.sweep (no timer made and cancelled per
    # request: that was a sixth of the request path's CPU)

    def _expect(self, what: int, within_s: float) -> None:
        self.waiting_for, self.deadline = what, self.loop.time() + within_s

    def _disarm(self) -> None:
        self.deadline = None

    def overdue(self, now: float) -> None:
        """The deadline passed: close, with a 408 when part of a request arrived."""
        self.deadline = None
        if self.gone or self.handed_over:
            return
        limits = self.server.limits
        if self.waiting_for == HEAD:
            if self.task is not None:  # a pipelined head waits behind an answer: judge it after
                self._expect(HEAD, limits.header_timeout_s)
                return
            if self.cur is not None:
                self.write(error_bytes(ProxyError(408, "The request headers did not arrive within "
                                                        f"{limits.header_timeout_s:g} s."), self._own(), close=True))
        elif self.waiting_for == BODY and self.cur is not None:
            self.write(error_bytes(ProxyError(408, "The request body did not arrive within "
                                                    f"{limits.body_timeout_s:g} s."), self._own(), close=True))
        self.close()

    # shutdown

    def close_if_idle(self) -> None:
        if self.task is None and not self.queue and self.cur is None:
            self.close()

    async def shutdown(self, timeout: float) -> None:
        """Let the answer in flight finish for up to `timeout`, then cut it (proxy/server.py)."""
        self._disarm()
        task = self.task
        if task is not None and not task.done():
            done, _ = await asyncio.wait({task}, timeout=max(0.0, timeout))
            if not done:
                self.cut_by_shutdown = True
                task.cancel()
                await asyncio.wait({task}, timeout=CUT_WAIT_S)
        self.close()


class Attempt:
    """One attempt's response as it arrives: kept until the dispatcher decides, then relayed
    (written to the client as each chunk comes) or kept whole."""

    def __init__(self, loop: asyncio.AbstractEventLoop, conn: UpstreamConnection, keep_limit: int) -> None:
        self.loop = loop
        self.conn = conn
        self.head: ResponseHead | None = None
        self.head_fut: asyncio.Future[ResponseHead] = loop.create_future()
        self.done: asyncio.Future[None] = loop.create_future()
        self.chunks: list[bytes] = []
        self.kept = 0
        self.keep_limit = keep_limit
        self.relay: Relay | None = None
        self.ended = False
        self.error: str | None = None
        self.last_at = loop.time()
        self.client_gone = False
        self.client_stalled = False
        self.paused = False
        self.timer: asyncio.TimerHandle | None = None
        self.stall_timer: asyncio.TimerHandle | None = None
        self.head_due = float("inf")
        """Loop time by which the answer's head must have come."""
        self.head_late = "first_byte_timeout"
        """The failure's reason when it does not."""

    # ResponseSink

    def on_head(self, head: ResponseHead) -> None:
        self.head = head
        if not self.head_fut.done():
            self.head_fut.set_result(head)

    def on_body(self, chunk: bytes) -> None:
        self.last_at = self.loop.time()
        if self.relay is not None:
            self.relay.write(chunk)
            return
        self.chunks.append(chunk)
        self.kept += len(chunk)
        if self.kept > self.keep_limit:  # more than the caller keeps: the rest is not wanted
            self._finish(error="too large")
            self.conn.abort()

    def on_end(self) -> None:
        if not self.head_fut.done():
            self.head_fut.set_exception(UpstreamFailure("protocol", retryable=False))
        self.ended = True
        self._finish()

    def on_lost(self, reason: str) -> None:
        if not self.head_fut.done():
            self.head_fut.set_exception(UpstreamFailure(reason, retryable=reason == "disconnect"))
        self._finish(error=f"the backend connection broke mid-response: {reason}")

    # the dispatcher's side

    def status_and_retry_after(self) -> tuple[int, str | None]:
        assert self.head is not None
        return self.head.status, self.head.retry_after

    def head_timed_out(self, reason: str) -> None:
        if not self.head_fut.done():
            self.head_fut.set_exception(UpstreamFailure(reason, retryable=False, status=504))

    def body(self) -> bytes:
        return b"".join(self.chunks)

    def watch(self, idle_s: float, deadline: float) -> None:
        """The backend's silence: `idle_s` between chunks at most, `deadline` in all."""
        self.idle_s, self.deadline = idle_s, deadline
        if self.done.done():  # it ended with its head: nothing to watch (a timer would keep it alive)
            return
        self.timer = self.loop.call_at(min(deadline, self.last_at + idle_s), self._check)

    def _check(self) -> None:
        self.timer = None
        if self.done.done():
            return
        now = self.loop.time()
        due = min(self.deadline, self.last_at + self.idle_s)
        if self.paused or now < due:  # a paused client is the stall timer's business
            self.timer = self.loop.call_at(max(due, now + 0.001) if not self.paused else now + self.idle_s,
                                           self._check)
            return
        self.conn.abort()
        self._finish(error="the backend stopped sending (idle or total timeout)")

    def start_relay(self, relay: Relay) -> None:
        self.relay = relay
        for chunk in self.chunks:
            relay.write(chunk)
        self.chunks = []

    def client_paused(self) -> None:
        self.paused = True
        self.conn.pause_reading()
        if self.stall_timer is None and self.relay is not None:  # only a relay writes to the client
            self.stall_timer = self.loop.call_later(self.relay.client_write_s, self._stalled)

    def client_resumed(self) -> None:
        self.paused = False
        if self.stall_timer is not None:
            self.stall_timer.cancel()
            self.stall_timer = None
        self.conn.resume_reading()

    def _stalled(self) -> None:
        self.stall_timer = None
        if self.done.done():
            return
        self.client_stalled = self.client_gone = True
        self.conn.abort()
        self._finish()

    def client_left(self) -> None:
        if self.done.done():
            return
        self.client_gone = True
        self.conn.abort()
        self._finish()

    def _finish(self, error: str | None = None) -> None:
        if self.done.done():
            return
        if error is not None and not self.ended:
            self.error = error
        for timer in (self.timer, self.stall_timer):
            if timer is not None:
                timer.cancel()
        self.done.set_result(None)


class Relay:
    """Writes a response body to the client as it comes: framed, less the usage event the proxy
    asked for, its tail (and a small JSON body) kept for accounting."""

    def __init__(self, front: FrontProtocol, chunked: bool, strip_usage: bool, keep_json: bool,
                 client_write_s: float) -> None:
        self.front = front
        self.loop = front.loop
        self.chunked = chunked
        self.filter = UsageEventFilter() if strip_usage else None
        self.body: bytearray | None = bytearray() if keep_json else None
        self.tail = b""
        self.first_byte_at: float | None = None
        self.client_write_s = client_write_s

    def write(self, chunk: bytes) -> None:
        if not chunk:
            return
        self.tail = (self.tail + chunk)[-TAIL_BYTES:] if len(chunk) < TAIL_BYTES else chunk[-TAIL_BYTES:]
        if self.body is not None and len(self.body) < 1 << 20:
            self.body += chunk
        out = chunk if self.filter is None else self.filter.feed(chunk)
        if out:
            self._send(out)
            if self.first_byte_at is None:
                self.first_byte_at = self.loop.time()

    def end(self) -> None:
        if self.filter is not None:
            rest = self.filter.flush()
            if rest:
                self._send(rest)
        if self.chunked:
            self.front.write(LAST_CHUNK)

    def _send(self, data: bytes) -> None:
        self.front.write(_chunk(data) if self.chunked else data)


class RequestStarts:
    """What a request to a backend on a route starts with, made once per backend and route (and
    again when the spec under the URL is replaced)."""

    def __init__(self) -> None:
        self._known: dict[tuple[str, str, str], RequestStart] = {}
        """By backend URL, method and route."""

    def get(self, spec: BackendSpec, fwd: Forward) -> RequestStart:
        key = (spec.url, fwd.method, fwd.path_qs)
        known = self._known.get(key)
        if known is not None and known.spec is spec:
            return known
        target = target_of(spec.url)
        auth = spec.authorization
        lines = b"".join((fwd.method.encode(), b" ", target.base_path.encode(), fwd.path_qs.encode(),
                          b" HTTP/1.1\r\nHost: ", target.host_header, b"\r\n",
                          b"Authorization: " + auth.encode("latin-1") + b"\r\n" if auth is not None else b""))
        if len(self._known) >= MAX_STARTS:  # backends come and go: never more than this kept
            self._known.clear()
        start = self._known[key] = RequestStart(
            spec, target, lines, b"x-flotilla-backend: " + spec.url.encode("latin-1", "replace") + b"\r\n",
            own_authorization=auth is not None)
        return start


class FastPath:
    """The proxy's request path for completions and chat (see the module)."""

    def __init__(self, app: web.Application) -> None:
        self.app = app
        self.proxy: Proxy = app[PROXY_KEY]
        config = self.proxy.config
        self.max_body_bytes = config.max_body_bytes
        self.upstream = UpstreamPool(not_relayed=DROP_DOWN)
        self.starts = RequestStarts()
        self._enabled: bool | None = None if config.fast_path else False
        self._dispatcher: Dispatcher | None = None
        self._static: list[tuple[str, str]] = []
        self._static_lines = b""
        """`_static` as header lines."""
        # Expect too: the whole body is here already, the engine need not invite it
        self._drop_up = _as_bytes(NOT_FORWARDED_UP | {"expect", "x-request-id"} | (
            {"authorization", "x-api-key"} if config.limits.api_keys else set()))
        self.fronts: set[FrontProtocol] = set()
        self._sweeping: asyncio.TimerHandle | None = None
        lim, timeouts = config.limits, config.timeouts
        self.tick_s = max(0.01, min(1.0, lim.header_timeout_s / 10, lim.body_timeout_s / 10,
                                    lim.keepalive_timeout_s / 10, timeouts.first_byte_s / 10,
                                    timeouts.total_s / 10))
        """How often deadlines are checked: a timeout fires within a tenth of itself (at most 1 s late)."""

    def protocol(self, server: GuardedServer) -> FrontProtocol:
        self.fronts = server.fronts
        return FrontProtocol(server, self)

    def watch(self) -> None:
        """Check the connections' deadlines every `tick_s` while there are any."""
        if self._sweeping is None:
            loop = asyncio.get_running_loop()
            self._sweeping = loop.call_later(self.tick_s, self.sweep, loop)

    def close(self) -> None:
        """At shutdown, once the connections are done: no more sweeps, no idle engine connections."""
        if self._sweeping is not None:
            self._sweeping.cancel()
            self._sweeping = None
        self.upstream.close()

    def sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        now = loop.time()
        for front in list(self.fronts):
            if front.deadline is not None and front.deadline <= now:
                front.overdue(now)
            waiting = front.head_wait
            if waiting is not None and waiting.head_due <= now:
                waiting.head_timed_out(waiting.head_late)
        self._sweeping = loop.call_later(self.tick_s, self.sweep, loop) if self.fronts else None

    def enabled(self) -> bool:
        """Fast only when the app runs nothing on these routes the fast path would skip."""
        if self._enabled is None:
            if not self.app.frozen or self.proxy.dispatcher is None:
                return False  # not started yet: aiohttp answers (with its 503s) until it is
            self._enabled = self._app_is_plain()
            self._dispatcher = self.proxy.dispatcher
            self._static = list(self.proxy.response_headers.items())
            self._static_lines = header_lines(self._static)
        return self._enabled

    def _app_is_plain(self) -> bool:
        access = self.proxy.access
        known = {errors_middleware, canonical_path_middleware, cut_middleware}
        if access is not None:
            known.add(access.middleware)
        plain_middleware = all(m in known for m in self.app.middlewares)
        plain_hooks = all(h is _remember_prepared or getattr(h, "static_header", False)
                          for h in self.app.on_response_prepare)
        return plain_middleware and plain_hooks

    def serves(self, req: Incoming) -> bool:
        return req.plain and req.method == b"POST" and req.url in FAST_ROUTES and req.version == "1.1"

    # one request

    async def serve(self, front: FrontProtocol, req: Incoming) -> bool:
        """Answer `req` on `front`; says whether the connection stays open."""
        p = self.proxy
        start = front.loop.time()
        headers = ClientHeaders(req)
        exchange = Exchange(self, front, req, headers, start)
        try:
            if p.access is not None and p.access.checks_clients:
                p.access.check_client(headers, front.remote)
            check_content_type(headers.get("Content-Type", ""))
            raw = b"".join(req.body)
            fwd = generation_forward(p.pool, p.config, p.policy, raw, load_json_object(raw), headers,
                                     req.url.decode("latin-1"), chat=FAST_ROUTES[req.url])
            admission = p.admission
            assert admission is not None
            gate = admission.gate(fwd.info.model or "")
            if not gate.try_take():
                await admission.wait(gate)
            taken = front.loop.time()
            try:
                if p.prefill is not None:
                    fwd = await with_prefill(p, fwd, headers, True)
                await exchange.dispatch(fwd)
            finally:
                gate.give_back(front.loop.time() - taken)
        except ProxyError as exc:
            exchange.answer_error(exc, OWN)
        except asyncio.CancelledError:  # the client left, or shutdown cut the request
            if front.cut_by_shutdown:  # last words, when nothing went out yet
                exchange.keep_alive = False
                exchange.answer_error(ProxyError(503, CUT_MESSAGE, headers={"Retry-After": "1"}),
                                      OWN)
            return False
        except Exception as exc:
            unexpected_warning.warning(f"unexpected {type(exc).__name__} on POST {req.url!r}: {str(exc)[:200]!r}")
            log.debug("unexpected error on POST %r", req.url, exc_info=True)
            if exchange.sent:
                return False
            exchange.answer_error(ProxyError(500, "Internal error in the proxy."), OWN)
        return exchange.keep_alive

    def upstream_fields(self, req: Incoming, request_id_line: bytes) -> bytes:
        """The client's end-to-end header lines for the engine (proxy/forward.py's rule)."""
        connection = req.header(b"connection")
        named = connection_named(connection) - self._drop_up if connection else None
        if named:  # it names end-to-end fields hop-by-hop for this request: drop them too
            drop = self._drop_up | named
            lines = [b"".join((name, b": ", value, b"\r\n"))
                     for name, value in req.headers if name.lower() not in drop]
        else:
            lines = req.up
        return b"".join(lines) + request_id_line


class Exchange:
    """One client request on the fast path: the retry loop of proxy/dispatch.py, over
    proxy/upstream.py."""

    def __init__(self, fast: FastPath, front: FrontProtocol, req: Incoming, headers: ClientHeaders,
                 start: float) -> None:
        self.fast = fast
        self.front = front
        self.req = req
        self.headers = headers
        self.start = start
        self.sent = False
        self.keep_alive = req.keep_alive
        d = fast._dispatcher
        assert d is not None
        self.d: Dispatcher = d
        # set by `dispatch`, read by the retry loop's steps (bound methods, not a closure per request)
        self.fwd: Forward | None = None
        self.fields = self.id_line = self.backend_line = b""
        self.request_id = ""
        self.deadline = 0.0

    def answer(self, status: int, reason: str, fields: list[Any], body: bytes, lines: bytes = b"") -> None:
        """A whole answer: `fields`, header `lines`, the static headers, and its length."""
        lines += self.fast._static_lines + b"Content-Length: %d\r\n" % len(body)
        self.front.write(response_head(status, reason, fields, not self.keep_alive, lines) + body)
        self.sent = True

    def answer_error(self, exc: ProxyError, default_headers: dict[str, str]) -> None:
        if self.sent:
            return
        self.front.write(error_bytes(exc, {**default_headers, **dict(self.fast._static)}, not self.keep_alive))
        self.sent = True

    def dispatch(self, fwd: Forward) -> Awaitable[None]:
        """The retry loop over this exchange's steps (awaited by the caller: no coroutine of its own)."""
        self.fwd = fwd
        self.deadline = self.start + self.d.config.timeouts.total_s
        # the client's X-Request-Id as parse_request read it, else a new one
        self.request_id = request_id = fwd.request_id or fwd.info.request_id or new_request_id()
        self.id_line = b"X-Request-Id: " + request_id.encode("latin-1", "replace") + b"\r\n"
        self.fields = self.fast.upstream_fields(self.req, self.id_line)
        return self.d.attempts(fwd, self._send, Attempt.status_and_retry_after, self._keep_answer, self._relay,
                               self._give_up)

    async def _send(self, backend: Backend) -> Attempt:
        fwd, fields, deadline = self.fwd, self.fields, self.deadline
        assert fwd is not None
        fast = self.fast
        loop = self.front.loop
        timeouts = self.d.config.timeouts
        start = fast.starts.get(backend.spec, fwd)
        target, self.backend_line = start.target, start.backend_line
        conn = fast.upstream.take_idle(target)
        if conn is None:
            try:
                async with asyncio.timeout(timeouts.connect_s):
                    conn = await fast.upstream.connect(target)
            except TimeoutError as exc:
                raise UpstreamFailure("connect", retryable=True, status=504) from exc
            except OSError as exc:
                raise UpstreamFailure("connect", retryable=True) from exc
        if start.own_authorization:  # the backend's own credentials replace whatever the client sent
            fields = b"\r\n".join(line for line in fields.split(b"\r\n")
                                  if not line.lower().startswith(b"authorization:"))
            fields = fields + (b"\r\n" if fields and not fields.endswith(b"\r\n") else b"")
        body = fwd.body
        attempt = Attempt(loop, conn, WHOLE_BODY_MAX_BYTES)
        conn.send(b"".join((start.lines, fields, b"Content-Length: %d\r\n\r\n" % len(body))), body, attempt)
        attempt.head_due = min(deadline, loop.time() + timeouts.first_byte_s)
        attempt.head_late = "total_timeout" if attempt.head_due == deadline else "first_byte_timeout"
        self.front.head_wait = attempt  # FastPath.sweep times it out: no timer made and cancelled per request
        try:
            await attempt.head_fut
        except BaseException:
            conn.abort()
            raise
        finally:
            self.front.head_wait = None
        return attempt

    async def _keep_answer(self, attempt: Attempt, backend: Backend, reservation: Reservation) -> RetryableAnswer:
        d = self.d
        head = attempt.head
        assert head is not None
        attempt.keep_limit = MAX_ERROR_BODY_BYTES
        try:
            attempt.watch(d.config.timeouts.idle_s, self.start + d.config.timeouts.total_s)
            await attempt.done
        finally:
            if not attempt.ended:
                attempt.conn.abort()
            d.pool.release(reservation)
        fields = {n.decode("latin-1"): v.decode("latin-1") for n, v in _down_fields(head)}
        return d.kept(backend, head.status, fields, attempt.body()[:MAX_ERROR_BODY_BYTES])

    def _give_up(self, tried: list[Backend], failure: UpstreamFailure | None,
                 answer: RetryableAnswer | None) -> None:
        fwd, request_id = self.fwd, self.request_id
        assert fwd is not None
        err, backend = self.d.no_attempt_left(fwd, tried, failure, answer, self.front.loop.time() - self.start)
        if err is None:
            assert answer is not None
            fields = [*answer.headers.items(), ("x-flotilla-backend", backend), ("X-Request-Id", request_id)]
            self.answer(answer.status, "", fields, answer.body)
            return
        self.answer_error(err, {"X-Request-Id": request_id, "x-flotilla-backend": backend})

    async def _relay(self, attempt: Attempt, backend: Backend, decision: Decision,
                     reservation: Reservation) -> None:
        d, fwd, id_line, deadline = self.d, self.fwd, self.id_line, self.deadline
        assert fwd is not None
        head = attempt.head
        assert head is not None
        front = self.front
        timeouts = d.config.timeouts
        fields = _down_fields(head)
        lines = self.backend_line + id_line  # the backend `_send` sent this attempt to
        if fwd.debug:
            lines += b"x-flotilla-rule: " + decision.rule.encode("latin-1", "replace") + b"\r\n"
        result: RelayResult | None = None  # made once the attempt ends (or when it is cut short)
        whole = head.content_length is not None and head.content_length <= WHOLE_BODY_MAX_BYTES \
            and not head.event_stream
        chunked = head.content_length is None or fwd.strip_usage
        try:
            attempt.watch(timeouts.idle_s, deadline)
            if whole:  # it reaches the client only complete anyway: one write at its end
                await attempt.done
                result = self._result(attempt, None)
                if result.error is not None:
                    raise ProxyError(502, f"The backend failed mid-response: {result.error}.",
                                     headers={"x-flotilla-backend": backend.url})
                if not result.client_gone:
                    self.answer(head.status, head.reason, fields, result.body or b"", lines)
                    result.first_byte_at_s = front.loop.time()
                return
            length = None if chunked else head.content_length
            lines += b"Transfer-Encoding: chunked\r\n" if length is None else b"Content-Length: %d\r\n" % length
            front.write(response_head(head.status, head.reason, fields, not self.keep_alive,
                                      lines + self.fast._static_lines))
            self.sent = True
            relay = Relay(front, chunked, fwd.strip_usage and head.event_stream,
                          fwd.accounts_usage and not head.event_stream, timeouts.client_write_s)
            front.attempt = attempt
            attempt.start_relay(relay)
            await attempt.done
            result = self._result(attempt, relay)
            if result.error is not None:
                self._end_broken(head, relay, result)
            elif result.completed:
                relay.end()
            elif result.client_stalled:
                front.abort()
        except asyncio.CancelledError:
            result = result or RelayResult(completed=False)
            if front.cut_by_shutdown:
                result.cut_by_shutdown = True
                if self.sent and head.event_stream:  # a blank line first closes a half-written event
                    event = b"\n\n" + sse_error_event(CUT_MESSAGE, 503)
                    front.write(_chunk(event) + LAST_CHUNK if chunked else event)
            else:
                result.client_gone = True
            raise
        finally:
            front.attempt = None
            if not attempt.ended:
                attempt.conn.abort()
            if result is None:
                result = RelayResult(completed=False)
            d.pool.release(reservation)
            d._finish(fwd, head.status, head.event_stream, backend, decision, result, self.start)
            if result.client_gone:
                d.metrics.client_disconnects.inc()
                self.keep_alive = False

    @staticmethod
    def _result(attempt: Attempt, relay: Relay | None) -> RelayResult:
        if relay is None:
            body = attempt.body()
            return RelayResult(completed=attempt.ended and attempt.error is None, client_gone=attempt.client_gone,
                               error=attempt.error, tail=body[-TAIL_BYTES:], body=body)
        return RelayResult(completed=attempt.ended and attempt.error is None and not attempt.client_gone,
                           client_gone=attempt.client_gone, client_stalled=attempt.client_stalled,
                           error=attempt.error, first_byte_at_s=relay.first_byte_at, tail=relay.tail,
                           body=bytes(relay.body) if relay.body is not None else None)

    def _end_broken(self, head: ResponseHead, relay: Relay, result: RelayResult) -> None:
        """An event stream gets an error event and [DONE] (and its end, so the connection stays
        usable); other bodies are cut off."""
        if head.event_stream:
            sep = b"" if not result.tail or result.tail.endswith((b"\n\n", b"\r\n\r\n")) else b"\n\n"
            event = sep + sse_error_event(result.error or "upstream failure")
            if relay.chunked:
                self.front.write(_chunk(event) + LAST_CHUNK)
                return
            self.front.write(event)
        self.keep_alive = False
        self.front.close()


LAST_CHUNK = b"0\r\n\r\n"


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


def _as_bytes(names: frozenset[str] | set[str]) -> frozenset[bytes]:
    return frozenset(n.encode("latin-1") for n in names)


DROP_DOWN = _as_bytes(NOT_FORWARDED_DOWN)


def _down_fields(head: ResponseHead) -> list[tuple[bytes, bytes]]:
    """The engine's end-to-end headers for the client (proxy/forward.py's rule): those a
    `Connection` field names are dropped too."""
    connection = head.connection
    if not connection:
        return head.relayed
    drop = connection_named(connection.encode("latin-1"))
    return [field for field in head.relayed if field[0].lower() not in drop]


def connection_named(value: bytes) -> set[bytes]:
    """The field names a Connection header lists (lower case): hop-by-hop for this message."""
    return {t.strip().lower() for t in value.split(b",")}
