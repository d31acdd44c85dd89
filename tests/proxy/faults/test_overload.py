"""A flood far larger than the per-model queue: every request gets a terminal answer (200 or 429
with Retry-After), the queue never grows past its bound, and memory stays bounded."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from proxy.debug import rss_bytes
from proxy.limits import LimitsConfig

FLOOD = 5000
CONCURRENCY = 500
QUEUE = 50
SLOTS = 4


@pytest.mark.serial  # asserts on lateness/terminal answers under load: needs the machine to itself
async def test_a_flood_of_5000_against_a_queue_of_50_gets_terminal_answers_in_bounded_memory(
        fake_backend, proxy_for):
    backend = await fake_backend("b", chunks=2, chunk_delay_s=0.002)
    p = await proxy_for([backend], limits=LimitsConfig(max_in_flight_per_model=SLOTS, max_queued_per_model=QUEUE))
    admission = p.proxy.admission
    deepest = 0
    sampling = True

    async def sample() -> None:
        nonlocal deepest
        while sampling:
            deepest = max(deepest, admission.queued())
            await asyncio.sleep(0.001)  # sampling interval of the queue depth, not a wait

    statuses: dict[int, int] = {}
    retry_afters: set[str] = set()
    body = {"model": "tiny-llama", "prompt": "x" * 200, "max_tokens": 2}

    async def one(session: aiohttp.ClientSession) -> None:
        async with session.post(p.url + "/v1/completions", json=body) as resp:
            payload = await resp.read()
            statuses[resp.status] = statuses.get(resp.status, 0) + 1
            if resp.status == 429:
                retry_afters.add(resp.headers["Retry-After"])
                assert json.loads(payload)["error"]["code"] == "queue_full"

    sampler = asyncio.create_task(sample())
    rss_before = rss_bytes()
    connector = aiohttp.TCPConnector(limit=CONCURRENCY)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(one(session) for _ in range(FLOOD)))
    rss_growth = rss_bytes() - rss_before
    sampling = False
    await sampler
    assert sum(statuses.values()) == FLOOD
    assert set(statuses) == {200, 429}
    assert statuses[200] >= SLOTS and statuses[429] > FLOOD // 10
    assert all(int(v) >= 1 for v in retry_afters)
    assert deepest <= QUEUE
    assert admission.queued() == 0 and admission.gates["tiny-llama"].in_flight == 0
    assert rss_growth < 150 * 2**20
