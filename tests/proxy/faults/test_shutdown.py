"""Graceful shutdown of a proxy process: SIGTERM closes the port, in-flight streams finish within
--shutdown-grace-s, then the process exits."""

from __future__ import annotations

import asyncio
import signal
import sys
import time

import aiohttp
import pytest

from tests.conftest import REPO

BODY = {"model": "tiny-llama", "prompt": "hi", "max_tokens": 8, "stream": True}


async def start_proxy_process(backend_url: str, grace_s: float) -> tuple[asyncio.subprocess.Process, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "flotilla", "proxy", "--backend", backend_url, "--port", "0",
        "--health-interval-s", "0.1", "--shutdown-grace-s", str(grace_s), cwd=REPO,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
    url = line.split("listening on ")[1].split()[0]
    async with aiohttp.ClientSession() as s:
        for _ in range(200):
            async with s.get(url + "/ready") as r:
                if r.status == 200:
                    return proc, url
            await asyncio.sleep(0.05)
    raise AssertionError("the proxy never became ready")


async def refused(url: str) -> bool:
    try:
        async with aiohttp.ClientSession() as s, s.get(url + "/health"):
            return False
    except aiohttp.ClientConnectorError:
        return True


@pytest.fixture
async def proxy_process():
    procs: list[asyncio.subprocess.Process] = []

    async def start(backend_url: str, grace_s: float) -> tuple[asyncio.subprocess.Process, str]:
        proc, url = await start_proxy_process(backend_url, grace_s)
        procs.append(proc)
        return proc, url

    yield start
    for proc in procs:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()


async def test_sigterm_stops_accepting_and_lets_an_in_flight_stream_finish(fake_backend, proxy_process):
    backend = await fake_backend("slow", chunks=10, chunk_delay_s=0.15)
    proc, url = await proxy_process(backend.url, grace_s=20)
    async with aiohttp.ClientSession() as s, s.post(url + "/v1/completions", json=BODY) as resp:
        received = await resp.content.readany()
        proc.send_signal(signal.SIGTERM)
        for _ in range(60):
            if await refused(url):
                break
            await asyncio.sleep(0.05)
        assert await refused(url)
        received += await resp.content.read()
    assert resp.status == 200
    assert received.count(b"slow-") == 10 and received.rstrip().endswith(b"data: [DONE]")
    assert await asyncio.wait_for(proc.wait(), 10) == 0


async def test_a_stream_longer_than_the_grace_period_is_cut_and_the_process_exits(fake_backend, proxy_process):
    backend = await fake_backend("endless", chunks=200, chunk_delay_s=0.1)
    proc, url = await proxy_process(backend.url, grace_s=0.5)
    async with aiohttp.ClientSession() as s, s.post(url + "/v1/completions", json=BODY) as resp:
        await resp.content.readany()
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 10) == 0
        exited_after_s = time.monotonic() - t0
        try:
            rest = await resp.content.read()
        except aiohttp.ClientPayloadError:
            rest = b""
    assert b"[DONE]" not in rest
    assert 0.4 <= exited_after_s < 8.0
