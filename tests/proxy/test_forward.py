"""Headers both ways, and the two legs' timeouts: a stalled client is the client's fault."""

from __future__ import annotations

import asyncio
import json
import socket

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from policies.routing.base import BackendState
from proxy.breaker import CircuitState
from proxy.config import BreakerConfig, TimeoutConfig
from proxy.forward import downstream_headers, upstream_headers
from tests.proxy.conftest import ProxyFactory
from tests.waiting import wait_until


def test_hop_by_hop_headers_are_stripped_and_the_request_id_set() -> None:
    incoming = CIMultiDict({"Host": "proxy", "Connection": "keep-alive, X-Secret-Hop", "Keep-Alive": "timeout=5",
                            "X-Secret-Hop": "1", "Transfer-Encoding": "chunked", "Content-Length": "12",
                            "Authorization": "Bearer k", "Content-Type": "application/json",
                            "x-flotilla-debug": "1", "x-session-id": "s1"})
    out = upstream_headers(incoming, "rid-1", drop_authorization=False)
    assert dict(out) == {"Authorization": "Bearer k", "Content-Type": "application/json", "x-session-id": "s1",
                         "X-Request-Id": "rid-1"}
    assert "Authorization" not in upstream_headers(incoming, "rid-1", drop_authorization=True)


def test_the_body_goes_up_decoded_so_its_content_encoding_does_not() -> None:
    incoming = CIMultiDict({"Content-Encoding": "gzip", "Content-Type": "application/json"})
    assert dict(upstream_headers(incoming, "r", drop_authorization=False)) == {
        "Content-Type": "application/json", "X-Request-Id": "r"}


def test_response_headers_keep_end_to_end_ones_only() -> None:
    back = CIMultiDict({"Content-Type": "text/event-stream", "Transfer-Encoding": "chunked", "Server": "uvicorn",
                        "Date": "x", "Connection": "close", "X-Engine": "vllm", "Content-Encoding": "gzip"})
    assert dict(downstream_headers(back)) == {"Content-Type": "text/event-stream", "X-Engine": "vllm",
                                              "Content-Encoding": "gzip"}


class StreamingBackend:
    """An OpenAI-style backend whose streams are big events, sent as fast as they are taken, and
    which counts the streams its reader abandoned."""

    def __init__(self, event_bytes: int = 64 * 1024, events: int = 400) -> None:
        self.event = b"data: " + json.dumps({"choices": [{"index": 0, "text": "x" * event_bytes}]}).encode() + b"\n\n"
        self.events = events
        self.started = self.finished = self.aborted = 0
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> StreamingBackend:
        app = web.Application()
        app.add_routes([web.post("/v1/completions", self.stream), web.get("/health", self.ok),
                        web.get("/v1/models", self.models)])
        self.runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"
        return self

    async def ok(self, request: web.Request) -> web.Response:
        return web.json_response({})

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "tiny-llama", "object": "model"}]})

    async def stream(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.started += 1
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        try:
            for _ in range(self.events if body.get("max_tokens", 0) > 1 else 1):
                await resp.write(self.event)
            await resp.write(b"data: [DONE]\n\n")
        except (asyncio.CancelledError, ConnectionResetError):
            self.aborted += 1
            raise
        self.finished += 1
        return resp


async def stalled_reader(url: str) -> socket.socket:
    """A client that asks for a long stream, reads the response headers and then nothing more."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the window fills at once
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
    body = json.dumps({"model": "tiny-llama", "prompt": "hi", "max_tokens": 100, "stream": True}).encode()
    await asyncio.get_running_loop().sock_sendall(sock, (
        f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n").encode() + body)
    return sock


def dropped(sock: socket.socket) -> bool:
    """The proxy ended this client's connection (reset, or end of stream after what was buffered)."""
    try:
        while chunk := sock.recv(1 << 16):
            del chunk
        return True  # end of stream
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True


async def test_a_client_that_stops_reading_is_dropped_and_the_engine_request_aborted_without_blame(
        proxy_for: ProxyFactory) -> None:
    backend = await StreamingBackend().start()
    try:
        p = await proxy_for([backend], timeouts=TimeoutConfig(connect_s=1.0, first_byte_s=5.0, idle_s=0.5,
                                                              total_s=60.0, client_write_s=0.5),
                            breaker=BreakerConfig(failure_threshold=1, success_threshold=1, open_s=60.0))
        b = p.proxy.pool.find(backend.url)
        await wait_until(lambda: b.state is BackendState.READY, what="the backend ready")
        sock = await stalled_reader(p.url)
        try:
            await wait_until(lambda: backend.aborted == 1, what="the engine's stream aborted")
            await wait_until(lambda: dropped(sock), what="the stalled client dropped")
        finally:
            sock.close()
        assert backend.finished == 0
        assert b.state is BackendState.READY and b.breaker.state is CircuitState.CLOSED and b.breaker.failures == 0
        assert p.proxy.metrics.client_disconnects._value.get() == 1
        assert b"flotilla_backend_ejections_total{" not in p.proxy.metrics.exposition()
        async with aiohttp.ClientSession() as s:
            async with s.post(p.url + "/v1/completions", json={"model": "tiny-llama", "prompt": "hi",
                                                               "max_tokens": 1, "stream": True}) as r:
                assert r.status == 200 and (await r.read()).endswith(b"data: [DONE]\n\n")
        assert b.in_flight == 0
    finally:
        await backend.runner.cleanup()


def test_request_ids_are_uuid_sized_hex_and_a_forked_worker_draws_its_own() -> None:
    import os

    from proxy.forward import new_request_id

    ids = {new_request_id() for _ in range(1000)}
    assert len(ids) == 1000 and all(len(i) == 32 and int(i, 16) >= 0 for i in ids)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next id, to the parent
        os.write(write, new_request_id().encode())
        os._exit(0)
    os.waitpid(pid, 0)
    child = os.read(read, 64).decode()
    assert child != new_request_id() and child not in ids
