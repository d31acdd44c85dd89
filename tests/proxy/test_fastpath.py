"""The fast request path (proxy/fastpath.py) over real sockets: what it serves itself, what it
hands to aiohttp on the same connection, and HTTP/1.1 the way clients really send it (pipelined,
chunked bodies, Expect: 100-continue)."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
from collections.abc import AsyncIterator, Callable
from email.utils import parsedate_to_datetime

import aiohttp
import pytest
from aiohttp import web
from multidict import CIMultiDict

from policies.routing.base import RequestInfo
from proxy.app import RunningProxy, start_proxy
from proxy.config import BackendSpec
from proxy.fastpath import ClientHeaders, Incoming, RequestStarts
from proxy.records import Forward
from tests.proxy.conftest import BackendFactory, ProxyFactory, fast_config

BODY = json.dumps({"model": "tiny-llama", "prompt": "hello"}).encode()


def post(path: str, body: bytes = BODY, extra: bytes = b"") -> bytes:
    return (b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n%s"
            % (path.encode(), extra, len(body), body))


def get(path: str) -> bytes:
    return b"GET %s HTTP/1.1\r\nHost: x\r\n\r\n" % path.encode()


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One response off a raw connection (Content-Length or chunked)."""
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    status = int(head[0].split()[1])
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in head[1:] if line)}
    if "content-length" in headers:
        return status, headers, await reader.readexactly(int(headers["content-length"]))
    body = b""
    while True:
        size = int((await reader.readuntil(b"\r\n")).strip(), 16)
        chunk = await reader.readexactly(size + 2)
        if size == 0:
            return status, headers, body
        body += chunk[:-2]


@contextlib.asynccontextmanager
async def connected(p: RunningProxy) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """A raw client connection to the proxy, closed at the end."""
    reader, writer = await asyncio.open_connection("127.0.0.1", p.port)
    try:
        yield reader, writer
    finally:
        writer.close()


def kinds(p: RunningProxy) -> tuple[int, int]:
    """Open client connections (on the fast path, handed to aiohttp)."""
    server = p.runner.server
    return len(server.fronts), len(server.connections)  # type: ignore[attr-defined]


async def test_completions_stay_on_the_fast_path_and_another_route_hands_the_connection_to_aiohttp(
        fake_backend: BackendFactory, proxy_for: ProxyFactory) -> None:
    b = await fake_backend()
    p = await proxy_for([b])
    async with connected(p) as (reader, writer):
        for _ in range(3):
            writer.write(post("/v1/completions"))
            status, headers, _ = await read_response(reader)
            assert status == 200 and headers["x-flotilla-backend"] == b.url
            assert parsedate_to_datetime(headers["date"]).tzinfo is not None
        assert kinds(p) == (1, 0)
        writer.write(get("/v1/models"))
        status, _, body = await read_response(reader)
        assert status == 200 and json.loads(body)["data"][0]["id"] == "tiny-llama"
        assert kinds(p) == (0, 1)  # the same connection, now aiohttp's
        writer.write(post("/v1/chat/completions", json.dumps(
            {"model": "tiny-llama", "messages": [{"role": "user", "content": "x"}]}).encode()))
        status, headers, _ = await read_response(reader)
        assert status == 200 and headers["x-flotilla-backend"] == b.url
    assert b.received == 4


@pytest.mark.parametrize("head", [b"Content-Encoding: gzip\r\nContent-Encoding: identity\r\n",
                                  b"Content-Encoding: identity\r\nX-Flotilla-Debug: 1\r\n",
                                  b"Upgrade: h2c\r\n"])
async def test_a_coding_in_any_field_or_a_debug_or_upgrade_header_goes_to_aiohttp(
        fake_backend: BackendFactory, proxy_for: ProxyFactory, head: bytes) -> None:
    p = await proxy_for([await fake_backend()])
    async with connected(p) as (reader, writer):
        writer.write(post("/v1/completions", gzip.compress(BODY) if b"gzip" in head else BODY, extra=head))
        await read_response(reader)
        assert kinds(p) == (0, 1)  # not the fast path's: it never undoes a coding


async def test_an_identity_coding_stays_on_the_fast_path(fake_backend: BackendFactory,
                                                         proxy_for: ProxyFactory) -> None:
    p = await proxy_for([await fake_backend()])
    async with connected(p) as (reader, writer):
        writer.write(post("/v1/completions", extra=b"Content-Encoding: identity\r\n"))
        status, _, _ = await read_response(reader)
        assert status == 200 and kinds(p) == (1, 0)


async def test_pipelined_requests_are_answered_in_order_across_both_paths(
        fake_backend: BackendFactory, proxy_for: ProxyFactory) -> None:
    b = await fake_backend()
    p = await proxy_for([b])
    async with connected(p) as (reader, writer):
        writer.write(post("/v1/completions", extra=b"X-Request-Id: first\r\n")
                     + post("/v1/completions", extra=b"X-Request-Id: second\r\n")
                     + get("/health") + post("/v1/completions", extra=b"X-Request-Id: fourth\r\n"))
        answers = [await read_response(reader) for _ in range(4)]
    assert [a[0] for a in answers] == [200, 200, 200, 200]
    assert [a[1].get("x-request-id") for a in answers] == ["first", "second", None, "fourth"]
    assert json.loads(answers[2][2]) == {"status": "ok"}


async def test_a_chunked_request_body_reaches_the_engine_whole(fake_backend: BackendFactory,
                                                               proxy_for: ProxyFactory) -> None:
    b = await fake_backend()
    p = await proxy_for([b])
    async with connected(p) as (reader, writer):
        half = len(BODY) // 2
        chunked = b"%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n" % (half, BODY[:half], len(BODY) - half, BODY[half:])
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n" + chunked)
        status, _, body = await read_response(reader)
    assert status == 200 and json.loads(body)["object"] == "text_completion"
    assert b.received == 1 and "Transfer-Encoding" not in b.request_headers[0]


@pytest.mark.parametrize("connection", [b"", b"Connection: keep-alive\r\n", b"Connection: X-Hop, keep-alive\r\n"])
async def test_the_engine_gets_the_clients_end_to_end_headers_and_none_its_connection_names(
        fake_backend: BackendFactory, proxy_for: ProxyFactory, connection: bytes) -> None:
    b = await fake_backend()
    p = await proxy_for([b])
    async with connected(p) as (reader, writer):
        writer.write(post("/v1/completions", extra=b"X-Hop: 1\r\nX-Keep: 2\r\nKeep-Alive: 5\r\n" + connection))
        status, _, _ = await read_response(reader)
    assert status == 200
    seen = b.request_headers[0]
    assert seen["X-Keep"] == "2" and seen["Content-Type"] == "application/json" and seen["X-Request-Id"]
    assert "Keep-Alive" not in seen and "Transfer-Encoding" not in seen
    assert ("X-Hop" in seen) == (b"X-Hop" not in connection)  # a field the Connection header names is hop-by-hop


async def test_expect_100_continue_gets_continue_before_the_body_is_sent(fake_backend: BackendFactory,
                                                                        proxy_for: ProxyFactory) -> None:
    b = await fake_backend()
    p = await proxy_for([b])
    async with connected(p) as (reader, writer):
        head, body = post("/v1/completions", extra=b"Expect: 100-continue\r\n").split(b"\r\n\r\n", 1)
        writer.write(head + b"\r\n\r\n")
        assert await reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(body)
        status, _, _ = await read_response(reader)
    assert status == 200 and b.received == 1


async def test_upstream_connections_are_kept_alive_and_reused(fake_backend: BackendFactory,
                                                              proxy_for: ProxyFactory) -> None:
    b = await fake_backend()
    p = await proxy_for([b])
    async with aiohttp.ClientSession() as s:
        for _ in range(5):
            async with s.post(p.url + "/v1/completions", data=BODY,
                              headers={"Content-Type": "application/json"}) as r:
                assert r.status == 200
                await r.read()
    fast = p.runner.server.fast  # type: ignore[attr-defined]
    assert sum(len(conns) for conns in fast.upstream.idle.values()) == 1
    assert b.received == 5


async def test_no_fast_path_answers_every_request_through_aiohttp(fake_backend: BackendFactory,
                                                                  proxy_for: ProxyFactory) -> None:
    b = await fake_backend()
    p = await proxy_for([b], fast_path=False)
    async with connected(p) as (reader, writer):
        writer.write(post("/v1/completions"))
        status, headers, _ = await read_response(reader)
        assert status == 200 and headers["x-flotilla-backend"] == b.url
        assert kinds(p) == (0, 1)


async def test_a_middleware_the_fast_path_does_not_run_sends_every_request_through_aiohttp(
        fake_backend: BackendFactory) -> None:
    """Added middleware (the autoscaler's hold, an operator's own) must see every request."""
    b = await fake_backend()
    seen: list[str] = []

    @web.middleware
    async def note(request: web.Request, handler):  # type: ignore[no-untyped-def]
        seen.append(request.path)
        return await handler(request)

    p = await start_proxy(fast_config([b]), extend=lambda app: app.middlewares.append(note))
    try:
        async with aiohttp.ClientSession() as s:
            async with s.post(p.url + "/v1/completions", data=BODY,
                              headers={"Content-Type": "application/json"}) as r:
                assert r.status == 200
        assert seen == ["/v1/completions"]
    finally:
        await p.close()


@pytest.mark.parametrize("extra", [
    b"X-Big: " + b"a" * 9000 + b"\r\n",  # one field past its limit
    b"".join(b"X-%d: a\r\n" % i for i in range(130)),  # more fields than 128, the head still short
    b"".join(b"X-%d: %s\r\n" % (i, b"a" * 8000) for i in range(9)),  # every field within, the head past 64 KB
])
async def test_a_head_past_the_limits_gets_431_as_json_and_the_connection_closes(
        fake_backend: BackendFactory, proxy_for: ProxyFactory, extra: bytes) -> None:
    b = await fake_backend()
    p = await proxy_for([b])
    async with connected(p) as (reader, writer):
        writer.write(post("/v1/completions", extra=extra))
        status, headers, body = await read_response(reader)
        assert status == 431 and json.loads(body)["error"]["code"] == 431
        assert headers["connection"] == "close" and await reader.read() == b""
    assert b.received == 0


@pytest.mark.parametrize("extra", [
    b"X-Big: " + b"a" * 8000 + b"\r\n",  # one field just within its limit
    b"".join(b"X-%d: a\r\n" % i for i in range(120)),  # 123 fields with the post's own three
    b"".join(b"X-%d: %s\r\n" % (i, b"a" * 500) for i in range(120)),  # 61 KB in 123 fields
])
async def test_a_head_within_every_limit_is_served(fake_backend: BackendFactory, proxy_for: ProxyFactory,
                                                   extra: bytes) -> None:
    b = await fake_backend()
    p = await proxy_for([b])
    async with connected(p) as (reader, writer):
        writer.write(post("/v1/completions", extra=extra))
        status, _, _ = await read_response(reader)
        assert status == 200
    assert b.received == 1


async def test_finished_requests_leave_no_attempt_behind(fake_backend: BackendFactory,
                                                         proxy_for: ProxyFactory) -> None:
    """An answer that ended with its own head once armed an idle timer that kept the attempt, and
    all it held, alive for the idle timeout: thousands per second of garbage the collector kept
    walking."""
    import gc

    from proxy.fastpath import Attempt

    b = await fake_backend()
    p = await proxy_for([b])
    async with aiohttp.ClientSession() as s:
        for stream in (False, True) * 10:
            async with s.post(p.url + "/v1/completions", json={"model": "tiny-llama", "prompt": "x",
                                                                "stream": stream}) as r:
                assert r.status == 200
                await r.read()
    gc.collect()
    assert [o for o in gc.get_objects() if isinstance(o, Attempt)] == []


async def test_a_request_pipelined_behind_one_being_answered_waits_its_turn(fake_backend: BackendFactory,
                                                                           proxy_for: ProxyFactory) -> None:
    b = await fake_backend(first_byte_delay_s=0.2)
    p = await proxy_for([b])
    async with connected(p) as (reader, writer):
        writer.write(post("/v1/completions", extra=b"X-Request-Id: first\r\n"))
        async with asyncio.timeout(10):
            while b.running == 0:  # the first is with the engine
                await asyncio.sleep(0.01)
        writer.write(post("/v1/completions", extra=b"X-Request-Id: second\r\n"))
        answers = [await read_response(reader) for _ in range(2)]
    assert [(a[0], a[1]["x-request-id"]) for a in answers] == [(200, "first"), (200, "second")]
    assert b.received == 2


def test_client_headers_read_as_the_multidict_of_every_field_does() -> None:
    fields = [(b"Content-Type", b"application/json"), (b"X-Tag", b"one"), (b"x-tag", b"two"),
              (b"Authorization", b"Bearer k"), (b"X-Latin", b"caf\xe9")]
    req = Incoming(headers=fields)
    for name, value in fields:
        req.first.setdefault(name.lower(), value)
    lazy = ClientHeaders(req)
    full = CIMultiDict([(n.decode("latin-1"), v.decode("latin-1")) for n, v in fields])
    for name in ("content-type", "CONTENT-TYPE", "X-Tag", "x-tag", "authorization", "X-Latin", "missing"):
        assert lazy.get(name) == full.get(name), name
        assert lazy.get(name, "d") == full.get(name, "d"), name
        assert (name in lazy) == (name in full), name
    assert list(lazy.items()) == list(full.items())  # repeated names keep their own values
    assert lazy.getall("X-TAG") == ["one", "two"] and lazy["x-tag"] == "one" and len(lazy) == 5


def test_a_request_start_is_made_again_when_the_backend_spec_under_its_url_changes() -> None:
    starts = RequestStarts()
    fwd = Forward("POST", "/v1/completions", b"{}", RequestInfo())
    first = starts.get(BackendSpec("http://e:8000/base", api_key="one"), fwd).lines
    again = starts.get(BackendSpec("http://e:8000/base", api_key="two"), fwd).lines
    assert first == b"POST /base/v1/completions HTTP/1.1\r\nHost: e:8000\r\nAuthorization: Bearer one\r\n"
    assert again.endswith(b"Authorization: Bearer two\r\n")
    plain_spec = BackendSpec("http://e:8000/base")
    plain = starts.get(plain_spec, fwd)
    assert b"Authorization" not in plain.lines and not plain.own_authorization
    assert starts.get(plain_spec, fwd) is plain  # the same spec: kept
    assert plain.backend_line == b"x-flotilla-backend: http://e:8000/base\r\n"


class RecordingTransport(asyncio.Transport):
    """A client's side as FrontProtocol sees it: what was written, and every pause of reading."""

    def __init__(self, on_write: Callable[[bytes], None]) -> None:
        super().__init__()
        self.written: list[bytes] = []
        self.pauses = 0
        self.on_write = on_write

    def get_extra_info(self, name: str, default: object = None) -> object:
        return ("127.0.0.1", 40000) if name == "peername" else default

    def write(self, data: bytes) -> None:  # type: ignore[override]
        self.written.append(bytes(data))
        self.on_write(data)

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None:
        self.pauses += 1

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        pass


async def test_the_next_request_read_before_the_last_ones_bookkeeping_does_not_pause_reading(
        fake_backend: BackendFactory, proxy_for: ProxyFactory) -> None:
    """A client that sends its next request the moment an answer arrives (wrk, a busy SDK) often
    lands between the answer's task ending and its done-callback: the connection is not
    pipelining, and pausing then resuming its reading costs the event loop two epoll changes."""
    b = await fake_backend()
    p = await proxy_for([b])
    loop = asyncio.get_running_loop()
    front = p.runner.server()  # type: ignore[attr-defined]
    in_the_window: list[bool] = []

    def next_request() -> None:
        in_the_window.append(front.task is not None and front.task.done())
        front.data_received(post("/v1/completions", extra=b"X-Request-Id: second\r\n"))

    # the first answer is written inside its task's last step: the request fed from the next
    # call_soon arrives after that task is done and before its done-callback runs
    transport = RecordingTransport(lambda data: len(transport.written) == 1 and loop.call_soon(next_request))
    front.connection_made(transport)
    front.data_received(post("/v1/completions", extra=b"X-Request-Id: first\r\n"))
    async with asyncio.timeout(10):
        while len(transport.written) < 2:
            await asyncio.sleep(0.01)
    assert [w.split(b"\r\n", 1)[0] for w in transport.written] == [b"HTTP/1.1 200 OK"] * 2
    assert b"x-request-id: second" in transport.written[1].lower()
    assert in_the_window == [True]  # the case this test is about: done, its callback not yet run
    assert transport.pauses == 0
    front.connection_lost(None)
