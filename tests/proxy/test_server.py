"""Slow and greedy clients over real sockets: a per-client connection cap, header and body read
timeouts, and idle keep-alive connections left alone; a normal request is served throughout and
nothing lands in the log as a traceback."""

from __future__ import annotations

import asyncio
import json
import logging
import platform
import subprocess
import sys

import aiohttp
import pytest
from aiohttp import web

from policies.routing.base import BackendState
from proxy import server as server_mod
from proxy.errors import ThrottledWarning
from proxy.limits import LimitsConfig
from proxy.ratelimit import client_id
from proxy.server import ConnectionCounter, ProxyRunner, missing_aiohttp_internals
from tests.waiting import wait_until

BODY = {"model": "tiny-llama", "prompt": "hi", "max_tokens": 2}
PARTIAL_HEAD = b"POST /v1/completions HTTP/1.1\r\nHost: proxy\r\nContent-Type: application/json\r\n"
ATTACKER = "127.0.0.2"
"""Another loopback address (Linux routes all of 127/8 to lo): the attacker is a client of its own."""


async def open_from(address: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port, local_addr=(address, 0))


async def read_to_eof(reader: asyncio.StreamReader) -> bytes:
    """What the proxy sent before closing (a reset counts as closed)."""
    try:
        return await reader.read()
    except ConnectionResetError:
        return b""


def no_tracebacks(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]


async def completion_status(url: str) -> int:
    async with aiohttp.ClientSession() as s, s.post(url + "/v1/completions", json=BODY) as r:
        await r.read()
        return r.status


async def test_hundreds_of_partial_header_sockets_cannot_crowd_out_a_normal_request(fake_backend, proxy_for, caplog):
    b = await fake_backend()
    cap = 40
    p = await proxy_for([b], limits=LimitsConfig(max_connections_per_client=cap, header_timeout_s=1.0))
    counter = p.runner.server.counter
    held = []  # the attacker's open connections, sampled all through the attack

    async def watch() -> None:
        while True:
            held.append(counter.open.get(ATTACKER, 0))
            await asyncio.sleep(0.005)  # a sampling period, not a wait for a condition

    watcher = asyncio.ensure_future(watch())
    sockets = []
    for _ in range(300):
        reader, writer = await open_from(ATTACKER, p.port)
        writer.write(PARTIAL_HEAD)
        sockets.append((reader, writer))
    answers = [asyncio.ensure_future(read_to_eof(r)) for r, _ in sockets]
    # Past the cap the proxy closes at once, reading nothing: the attacker holds `cap` sockets at most.
    # On a loaded machine opening 300 sockets outlasts the header timeout, so sockets freed by a 408
    # are taken again by later ones: what must hold is the cap at every moment, not a count of 408s.
    await wait_until(lambda: sum(a.done() for a in answers) >= 300 - cap, what="sockets past the cap closed")
    assert counter.open.get(ATTACKER, 0) <= cap
    assert await completion_status(p.url) == 200
    # The rest are closed by the header timeout, each with a 408 in JSON.
    await asyncio.wait_for(asyncio.gather(*answers), 30)
    watcher.cancel()
    timed_out = [a.result() for a in answers if a.result()]
    assert timed_out and max(held) <= cap
    assert all(t.startswith(b"HTTP/1.1 408 ") for t in timed_out)
    error = json.loads(timed_out[0].split(b"\r\n\r\n", 1)[1])["error"]
    assert error["type"] == "timeout_error" and "headers" in error["message"]
    await wait_until(lambda: ATTACKER not in counter.open, what="the attacker's connections all released")
    for _, writer in sockets:
        writer.close()
    assert await completion_status(p.url) == 200
    assert [backend.state for backend in p.proxy.pool] == [BackendState.READY]
    assert no_tracebacks(caplog) == []


async def test_headers_dribbled_a_byte_at_a_time_are_cut_at_the_header_timeout(fake_backend, proxy_for):
    b = await fake_backend()
    p = await proxy_for([b], limits=LimitsConfig(header_timeout_s=0.5))
    loop = asyncio.get_running_loop()
    started = loop.time()  # before connecting: the proxy's clock starts when it accepts, which may be sooner
    reader, writer = await open_from(ATTACKER, p.port)
    answer = asyncio.ensure_future(read_to_eof(reader))
    for byte in (PARTIAL_HEAD * 10):  # never a complete head, never a pause as long as the timeout
        if answer.done():
            break
        writer.write(bytes([byte]))
        await asyncio.sleep(0.01)
    assert (await asyncio.wait_for(answer, 30)).startswith(b"HTTP/1.1 408 ")
    assert loop.time() - started >= 0.5
    writer.close()


async def test_a_connection_that_sends_nothing_is_closed_silently_at_the_header_timeout(fake_backend, proxy_for):
    b = await fake_backend()
    p = await proxy_for([b], limits=LimitsConfig(header_timeout_s=0.3))
    reader, writer = await open_from(ATTACKER, p.port)
    assert await asyncio.wait_for(read_to_eof(reader), 30) == b""
    writer.close()


async def test_a_body_slower_than_the_body_timeout_gets_408_and_the_connection_closes(fake_backend, proxy_for,
                                                                                      caplog):
    b = await fake_backend()
    p = await proxy_for([b], limits=LimitsConfig(body_timeout_s=0.5))
    reader, writer = await open_from(ATTACKER, p.port)
    writer.write(PARTIAL_HEAD + b"Content-Length: 100\r\n\r\n" + b'{"prompt": "')
    answer = await asyncio.wait_for(read_to_eof(reader), 30)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 ")
    error = json.loads(body)["error"]
    assert error["type"] == "timeout_error" and "body" in error["message"]
    assert b.received == 0
    writer.close()
    assert await completion_status(p.url) == 200
    assert no_tracebacks(caplog) == []


async def test_an_idle_keep_alive_connection_outlives_the_header_timeout(fake_backend, proxy_for):
    b = await fake_backend()
    p = await proxy_for([b], limits=LimitsConfig(header_timeout_s=0.2, keepalive_timeout_s=30))
    reader, writer = await open_from(ATTACKER, p.port)
    body = json.dumps(BODY).encode()
    request = PARTIAL_HEAD + b"Content-Length: %d\r\n\r\n" % len(body) + body
    for i in range(2):
        writer.write(request)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
        assert head.startswith(b"HTTP/1.1 200 "), head
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))
        await reader.readexactly(length)
        if i == 0:
            # Idle, a stray CRLF included (RFC 9112 lets clients send one), for several header
            # timeouts: proving an absence takes a wait.
            writer.write(b"\r\n")
            await asyncio.sleep(0.8)
    writer.close()


async def test_without_a_cap_one_client_may_open_many_connections(fake_backend, proxy_for):
    b = await fake_backend()
    p = await proxy_for([b], limits=LimitsConfig(max_connections_per_client=0))
    opened = [await open_from(ATTACKER, p.port) for _ in range(50)]
    counter = p.runner.server.counter
    await wait_until(lambda: counter.open.get(ATTACKER) == 50, what="all 50 connections admitted")
    for _, writer in opened:
        writer.close()


def test_the_counter_admits_up_to_the_cap_per_client_and_forgets_clients_with_none_open():
    c = ConnectionCounter(cap=2)
    assert [c.admit("a"), c.admit("a"), c.admit("a"), c.admit("b")] == [True, True, False, True]
    c.release("a")
    assert c.admit("a")
    for _ in range(2):
        c.release("a")
    c.release("b")
    assert c.open == {}


def test_a_client_is_an_ipv4_address_or_an_ipv6_slash_64():
    assert client_id("10.0.0.7") == "10.0.0.7"
    assert client_id("::ffff:10.0.0.7") == "10.0.0.7"
    assert client_id("2001:db8:1:2:aaaa::1") == client_id("2001:db8:1:2:bbbb::9") == "2001:db8:1:2::/64"
    assert client_id("2001:db8:1:3::1") != client_id("2001:db8:1:2::1")


def test_throttled_warnings_log_one_line_per_period_and_count_the_rest(caplog):
    now = [0.0]
    w = ThrottledWarning(logging.getLogger("t"), every_s=10.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="t"):
        assert w.warning("first\nwith a newline")
        assert not w.warning("second")
        assert not w.warning("third")
        now[0] = 12.0
        assert w.warning("fourth")
    assert [r.getMessage() for r in caplog.records] == ["first with a newline",
                                                         "fourth (2 more like it in the last 12 s)"]


async def _missing_internals() -> list[str]:
    runner = web.AppRunner(web.Application())
    await runner.setup()
    try:
        return missing_aiohttp_internals(runner, runner.server)  # type: ignore[arg-type]  # set up above
    finally:
        await runner.cleanup()


async def test_the_aiohttp_internals_the_connection_guards_need_are_there():
    missing = await _missing_internals()
    assert not missing, (
        f"aiohttp {aiohttp.__version__} lacks {missing}: proxy/server.py (the connection cap, header and body "
        f"timeouts, the shutdown deadline) reads them. Check it against this aiohttp, then update "
        f"AIOHTTP_INTERNALS and the aiohttp bound in pyproject.toml.")


async def test_an_aiohttp_without_an_internal_is_named_and_the_proxy_refuses_to_start(monkeypatch):
    monkeypatch.setitem(server_mod.AIOHTTP_INTERNALS, "RequestHandler", ("_request_count", "_gone_in_a_release"))
    assert await _missing_internals() == ["RequestHandler._gone_in_a_release"]
    runner = ProxyRunner(web.Application(), LimitsConfig())
    with pytest.raises(RuntimeError, match=r"lacks RequestHandler\._gone_in_a_release.*pyproject\.toml"):
        await runner.setup()
    await runner.cleanup()


_FAULTS = """
import resource, sys
from proxy.server import keep_freed_heap
took = keep_freed_heap() if sys.argv[1] == "keep" else False
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for i in range(200):  # what a long prompt does per request: a few 400 KB buffers, then freed
    a = bytes(400_000); b = a + b"x"; c = b.decode(); del a, b, c
print(took, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")
def test_kept_heap_stops_long_bodies_faulting_their_pages_in_on_every_request():
    def faults(mode: str) -> tuple[str, int]:
        out = subprocess.run([sys.executable, "-c", _FAULTS, mode], capture_output=True, text=True, check=True)
        took, count = out.stdout.split()
        return took, int(count)

    default, kept = faults("default"), faults("keep")
    assert kept[0] == "True"
    assert kept[1] * 10 < default[1], (default, kept)
