"""Graceful shutdown of a proxy process: SIGTERM closes the port, in-flight streams finish within
--shutdown-grace-s, what still runs then is cut with a last word (an error event, or a 503), then
the process exits."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time

import aiohttp
import pytest

from proxy.dispatch import unfinished_status
from proxy.forward import RelayResult
from proxy.limits import LimitsConfig
from tests.conftest import REPO
from tests.fake_engines.scrape import value
from tests.waiting import wait_until

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
    except aiohttp.ClientError:  # connected while the listener was closing: not refused yet
        return False


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
        await wait_until(lambda: refused(url), what="the proxy's port closed on SIGTERM")
        received += await resp.content.read()
    assert resp.status == 200
    assert received.count(b"slow-") == 10 and received.rstrip().endswith(b"data: [DONE]")
    assert await asyncio.wait_for(proc.wait(), 10) == 0


async def test_a_stream_longer_than_the_grace_is_cut_at_the_grace_with_a_final_error_event(fake_backend,
                                                                                           proxy_process):
    grace_s = 2.0
    backend = await fake_backend("endless", chunks=2000, chunk_delay_s=0.02)
    proc, url = await proxy_process(backend.url, grace_s=grace_s)
    async with aiohttp.ClientSession() as s, s.post(url + "/v1/completions", json=BODY) as resp:
        await resp.content.readany()
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        rest = await resp.content.read()  # to the end the proxy gives the stream
        cut_after_s = time.monotonic() - t0
    assert await asyncio.wait_for(proc.wait(), 10) == 0
    log = (await proc.stdout.read()).decode()
    assert "Traceback" not in log and " ERROR " not in log, log
    events = [e.strip() for e in rest.decode().split("\n\n") if e.strip()]
    assert events[-1] == "data: [DONE]"
    error = json.loads(events[-2].removeprefix("data: "))["error"]
    assert (error["code"], error["type"]) == (503, "unavailable_error") and "incomplete" in error["message"]
    assert sum(e.count("endless-") for e in events) < 2000
    # The grace, once: aiohttp alone waited it twice (and rounded each wait up to whole seconds).
    assert grace_s <= cut_after_s < 2 * grace_s


async def test_a_request_not_answered_by_the_end_of_the_grace_gets_503(fake_backend, proxy_for):
    backend = await fake_backend("stuck", first_byte_delay_s=60)
    p = await proxy_for([backend], limits=LimitsConfig(shutdown_grace_s=0.5))
    async with aiohttp.ClientSession() as s:
        pending = asyncio.ensure_future(s.post(p.url + "/v1/completions", json={**BODY, "stream": False}))
        await wait_until(lambda: backend.received == 1, what="the request reached the backend")
        await p.close()
        async with await pending as resp:
            assert resp.status == 503
            error = (await resp.json())["error"]
    assert error["type"] == "unavailable_error" and "shut down" in error["message"]


async def test_a_stream_cut_by_shutdown_is_counted_as_503_and_a_client_that_left_as_499(fake_backend, proxy_for):
    backend = await fake_backend("endless", chunks=2000, chunk_delay_s=0.02)
    p = await proxy_for([backend], limits=LimitsConfig(shutdown_grace_s=0.5))
    metrics = p.proxy.metrics
    async with aiohttp.ClientSession() as s:
        async with s.post(p.url + "/v1/completions", json=BODY) as resp:
            await resp.content.readany()
        # that client left mid-stream: a disconnect, 499
        await wait_until(lambda: metrics.client_disconnects._value.get() == 1, what="the disconnect counted")
        async with s.post(p.url + "/v1/completions", json=BODY) as resp:
            await resp.content.readany()
            closing = asyncio.ensure_future(p.close())
            rest = await resp.content.read()  # to the end the proxy gives the stream
            await closing
    assert b'"code":503' in rest.replace(b" ", b"")  # the cut stream's last word
    text = metrics.exposition().decode()
    assert value(text, "flotilla_requests_total", status="499") == 1
    assert value(text, "flotilla_requests_total", status="503") == 1  # not a second client disconnect
    assert value(text, "flotilla_client_disconnects_total") == 1


def test_an_unfinished_answer_is_labelled_by_whose_doing_it_was():
    assert unfinished_status(RelayResult(completed=False, client_gone=True)) == 499
    assert unfinished_status(RelayResult(completed=False, cut_by_shutdown=True)) == 503
    assert unfinished_status(RelayResult(completed=False, error="the backend closed the connection")) == 502
