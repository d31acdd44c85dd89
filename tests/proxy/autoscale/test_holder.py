"""Scale from zero over real sockets: requests wait through a look-alike engine's cold start and
succeed, streams get SSE comment lines meanwhile, and requests past the hold bounds get a 503
with a Retry-After."""

from __future__ import annotations

import asyncio
import json

import aiohttp

from proxy.autoscale import AutoscaleConfig, HoldSettings
from proxy.autoscale.holder import KEEPALIVE_LINE
from tests.proxy.autoscale.fleet import ENGINE_CMD, TIME_SCALE, autoscaled_proxy
from tests.waiting import wait_until

CHAT = {"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 8}


async def post(session: aiohttp.ClientSession, url: str, body: dict) -> tuple[int, dict, bytes]:
    async with session.post(url + "/v1/chat/completions", json=body) as resp:
        return resp.status, dict(resp.headers), await resp.read()


async def test_requests_wait_through_a_cold_start_and_beyond_the_bound_get_503_with_retry_after():
    hold = HoldSettings(max_requests=2, max_wait_s=60, keepalive_s=0.2)
    config = AutoscaleConfig(policy="seed:interval_s=20",
                             engine_cmd=ENGINE_CMD, min_replicas=0, max_replicas=1, time_scale=TIME_SCALE,
                             hold=hold)
    async with autoscaled_proxy(config) as fleet, aiohttp.ClientSession() as session:
        await wait_until(lambda: fleet.runtime.autoscaler.decisions, what="the autoscaler's first decision")
        assert fleet.runtime.autoscaler.replicas == {}  # min 0 and no traffic: nothing runs
        streamed = asyncio.create_task(post(session, fleet.url, {**CHAT, "stream": True}))
        whole = asyncio.create_task(post(session, fleet.url, CHAT))
        await wait_until(lambda: fleet.runtime.holder.held == 2, what="both requests held")
        status, headers, body = await post(session, fleet.url, CHAT)
        assert status == 503
        assert int(headers["Retry-After"]) >= 1
        assert json.loads(body)["error"]["type"] == "unavailable_error"
        status, headers, body = await whole
        assert status == 200
        assert json.loads(body)["choices"][0]["message"]["content"]
        status, headers, body = await streamed
        assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
        assert body.startswith(KEEPALIVE_LINE)
        events = [line for line in body.decode().split("\n\n") if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]"
        assert json.loads(events[0][6:])["object"] == "chat.completion.chunk"
        assert len(fleet.runtime.autoscaler.launched) == 1


async def test_a_request_held_longer_than_the_bound_gets_503_with_the_expected_wait():
    hold = HoldSettings(max_requests=4, max_wait_s=0.5, keepalive_s=10)
    # An engine that never answers: the replica stays loading.
    config = AutoscaleConfig(policy="cold-start-aware:interval_s=20,cold_start_s=100", engine_cmd="sh -c 'sleep 300' sh",
                             min_replicas=0, max_replicas=1, time_scale=TIME_SCALE, hold=hold)
    async with autoscaled_proxy(config) as fleet, aiohttp.ClientSession() as session:
        status, headers, body = await post(session, fleet.url, CHAT)
        assert status == 503
        # 100 s of cold start at time scale 0.05 is 5 real seconds, of which ~0.5 s have passed
        assert 4 <= int(headers["Retry-After"]) <= 5
        assert "within 0.5 s" in json.loads(body)["error"]["message"]
        assert len(fleet.runtime.autoscaler.replicas) == 1
