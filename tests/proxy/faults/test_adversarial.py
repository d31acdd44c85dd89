"""A battery of hostile clients against the proxy in front of two look-alike vLLM engines: path
tricks aimed at the engines' fault-injection admin, compressed and corrupt bodies, clients that
stop reading and clients that dribble their headers. Afterwards both engines still serve, none
was ejected, a normal request succeeds, and the proxy logged no traceback."""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import socket
import traceback

import aiohttp
import pytest

from fake_engines.driver.faults import FaultInjector
from fake_engines.vllm.config import VllmServeConfig
from fake_engines.vllm.server import start_vllm
from policies.routing.base import BackendState
from proxy.breaker import CircuitState
from proxy.config import BackendSpec, BreakerConfig, TimeoutConfig
from proxy.limits import LimitsConfig
from tests.proxy.test_forward import dropped
from tests.proxy.test_paths import CRASH, TRICKS, raw_request
from tests.waiting import wait_until

MODEL = "tiny-llama"
BODY = json.dumps({"model": MODEL, "prompt": "tell me a story", "max_tokens": 4}).encode()


async def stalled_stream(url: str) -> socket.socket:
    """Ask an engine for a long stream through the proxy, then stop reading."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, (host, int(port)))
    # 16 choices with usage on every event: about 7 MB a stream, enough to fill every buffer between
    body = json.dumps({"model": MODEL, "prompt": "go on", "max_tokens": 2000, "ignore_eos": True, "n": 16,
                       "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}
                       }).encode()
    await loop.sock_sendall(sock, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                            b"Content-Length: %d\r\n\r\n" % len(body) + body)
    return sock


async def slow_headers(url: str) -> bytes:
    """Send half a request's headers and nothing more; return what the proxy answers."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        return await asyncio.wait_for(reader.read(), 30)
    finally:
        writer.close()


@pytest.fixture
async def vllm_pair():
    started = []
    try:
        for _ in range(2):
            config = VllmServeConfig(model="llama-3.1-8b", served_model_name=MODEL, port=0, time_scale=0.01,
                                     max_model_len=32768)
            injector = FaultInjector()
            running = await start_vllm(config, cold_start=False, faults=injector)
            started.append((running, injector))
            await running.wait_ready()
        yield started
    finally:
        for running, _ in started:
            await running.close()


@pytest.mark.serial  # asserts on lateness/terminal answers under load: needs the machine to itself
async def test_after_a_battery_of_hostile_clients_the_fleet_is_whole_and_a_normal_request_succeeds(
        vllm_pair, proxy_for, caplog: pytest.LogCaptureFixture) -> None:
    specs = [BackendSpec(f"http://127.0.0.1:{running.port}", "vllm") for running, _ in vllm_pair]
    p = await proxy_for(specs, max_body_bytes=256 * 1024,
                        timeouts=TimeoutConfig(connect_s=1.0, first_byte_s=10.0, idle_s=5.0, total_s=60.0,
                                               client_write_s=0.5),
                        breaker=BreakerConfig(failure_threshold=2, success_threshold=1, open_s=60.0),
                        limits=LimitsConfig(header_timeout_s=0.5))
    caplog.set_level(logging.INFO)
    for target in TRICKS:
        status, _, _ = await raw_request(p.url, "POST", target, CRASH)
        assert status == 404, target
    compressed = [(gzip.compress(BODY), "gzip", 200)] * 12 + [
        (gzip.compress(b"\0" * (64 << 20)), "gzip", 413), (gzip.compress(BODY)[:-12], "gzip", 400),
        (b"\x1b\x00", "br", 415)]
    async with aiohttp.ClientSession() as s:
        for data, encoding, status in compressed:
            async with s.post(p.url + "/v1/completions", data=data, headers={
                    "Content-Type": "application/json", "Content-Encoding": encoding}) as r:
                assert r.status == status, encoding
                await r.read()
    stalled = [await stalled_stream(p.url) for _ in range(3)]
    try:
        # watched through the proxy's count, since polling a socket would read from it
        await wait_until(lambda: p.proxy.metrics.client_disconnects._value.get() == 3,
                         what="the stalled readers counted as gone")
        # the count moves when the proxy gives up on a client; its socket closes a moment later
        open_socks = set(stalled)

        def all_dropped() -> bool:
            open_socks.difference_update([sock for sock in open_socks if dropped(sock)])
            return not open_socks

        await wait_until(all_dropped, what="every stalled reader's connection ended")
        await wait_until(lambda: all(b.in_flight == 0 for b in p.proxy.pool), what="the engine requests ended")
    finally:
        for sock in stalled:
            sock.close()
    answers = await asyncio.gather(*(slow_headers(p.url) for _ in range(3)))
    assert all(a.startswith(b"HTTP/1.1 408") for a in answers)

    assert all(not injector.crashed for _, injector in vllm_pair)
    for b in p.proxy.pool:
        assert b.state is BackendState.READY and b.breaker.state is CircuitState.CLOSED, b.url
        assert b.breaker.failures == 0, b.url
    async with aiohttp.ClientSession() as s:
        async with s.post(p.url + "/v1/completions", data=BODY, headers={"Content-Type": "application/json"}) as r:
            assert r.status == 200 and (await r.json())["choices"]
        async with s.get(p.url + "/ready") as r:
            assert (await r.json())["ready_backends"] == 2
    assert b"flotilla_backend_ejections_total{" not in p.proxy.metrics.exposition()
    assert not proxy_errors(caplog.records)


def proxy_errors(records: list[logging.LogRecord]) -> list[str]:
    """Errors and tracebacks the proxy logged (the look-alike engines log in the same process)."""
    found = []
    for r in records:
        text = r.getMessage() + ("".join(traceback.format_exception(*r.exc_info)) if r.exc_info else "")
        if (r.exc_info or r.levelno >= logging.ERROR) and "fake_engines" not in text:
            found.append(text)
    return found
