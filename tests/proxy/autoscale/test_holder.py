"""Scale from zero over real sockets: requests wait through a look-alike engine's cold start and
succeed, streams get SSE comment lines meanwhile, and requests past the hold bounds get a 503
with a Retry-After."""

from __future__ import annotations

import asyncio
import gzip
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp

from proxy.app import start_proxy
from proxy.autoscale import AutoscaleConfig, HoldSettings, attach
from proxy.autoscale.holder import KEEPALIVE_LINE
from proxy.autoscale.setup import AutoscaleRuntime
from proxy.config import ProxyConfig
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


@asynccontextmanager
async def never_ready_proxy(hold: HoldSettings) -> AsyncIterator[tuple[str, AutoscaleRuntime]]:
    """`flotilla proxy --autoscale` as it runs (start_proxy: its own runner, bodies decoded by
    proxy/body.py) with no replica ready and none that ever becomes ready."""
    config = AutoscaleConfig(policy="cold-start-aware:interval_s=20,cold_start_s=100",
                             engine_cmd="sh -c 'sleep 300' sh", min_replicas=0, max_replicas=1,
                             time_scale=TIME_SCALE, hold=hold)
    runtimes: list[AutoscaleRuntime] = []
    running = await start_proxy(ProxyConfig(port=0), extend=lambda app: runtimes.append(attach(app, config)))
    try:
        yield running.url, runtimes[0]
    finally:
        await running.close()


async def test_only_forwarded_routes_are_held_any_other_post_and_a_refused_body_are_answered_at_once():
    # A held request would wait 600 s, far past the client's 30 s: any answer proves it was not held.
    hold = HoldSettings(max_requests=4, max_wait_s=600, keepalive_s=10)
    corrupt = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    async with never_ready_proxy(hold) as (url, runtime), \
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        answers = []
        for path, headers, data in (("/pooling", {}, b'{"input": "x"}'),
                                    ("/v1/load_lora_adapter", {}, b'{"lora_name": "a"}'),
                                    ("/v1/models", {}, b"{}"),
                                    ("/v1/completions", corrupt, b"not gzip at all")):
            async with session.post(url + path, data=data, headers=headers) as resp:
                answers.append((resp.status, (await resp.json())["error"]["message"]))
        assert runtime.holder.held == 0
        assert runtime.autoscaler.launched == []  # none of them asked the autoscaler for a replica
    assert [status for status, _ in answers] == [404, 404, 405, 400]
    assert "gzip" in answers[3][1]


async def test_a_held_gzip_stream_request_gets_sse_keepalives_then_the_final_error_event():
    hold = HoldSettings(max_requests=4, max_wait_s=1.0, keepalive_s=0.1)
    body = gzip.compress(json.dumps({**CHAT, "stream": True}).encode())
    headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    async with never_ready_proxy(hold) as (url, runtime), aiohttp.ClientSession() as session:
        async with session.post(url + "/v1/chat/completions", data=body, headers=headers) as resp:
            status, content_type, text = resp.status, resp.headers["Content-Type"], await resp.read()
        assert len(runtime.autoscaler.launched) == 1  # the hold asked for a replica
    assert status == 200 and content_type.startswith("text/event-stream")
    assert text.startswith(KEEPALIVE_LINE)
    events = [line for line in text.decode().split("\n\n") if line.startswith("data: ")]
    error = json.loads(events[0][6:])["error"]
    assert error["code"] == 503 and "No replica became ready within 1 s" in error["message"]
