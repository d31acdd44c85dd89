"""The proxy in front of look-alike engines (fake vLLM), over real sockets, with the openai SDK."""

import asyncio
import time

import aiohttp
import openai
import pytest

from fake_engines.vllm.config import VllmServeConfig
from fake_engines.vllm.server import start_vllm
from proxy.engine_metrics import parse_engine_metrics
from tests.proxy.conftest import ProxyFactory

MODEL = "tiny-llama"


@pytest.fixture
async def vllm_fleet():
    started = []

    async def start(n: int, time_scale: float = 1.0):
        for _ in range(n):
            config = VllmServeConfig(model="llama-3.1-8b", served_model_name=MODEL, port=0, time_scale=time_scale,
                                     max_model_len=4096)
            running = await start_vllm(config, cold_start=False)
            await running.wait_ready()
            started.append(running)
        return started

    yield start
    for running in started:
        await running.close()


class Url:
    """An engine's base URL, in the shape `proxy_for` takes backends."""

    def __init__(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}"


async def running_requests(url: str) -> float:
    async with aiohttp.ClientSession() as s:
        async with s.get(url + "/metrics") as r:
            return parse_engine_metrics(await r.text()).num_requests_running


async def test_openai_sdk_through_the_proxy_to_two_lookalike_vllm(vllm_fleet, proxy_for: ProxyFactory) -> None:
    engines = [Url(e.port) for e in await vllm_fleet(2, time_scale=0.05)]
    p = await proxy_for(engines, policy="round-robin")
    client = openai.AsyncOpenAI(base_url=p.url + "/v1", api_key="unused", max_retries=0)
    backends = set()
    for _ in range(2):
        raw = await client.completions.with_raw_response.create(model=MODEL, prompt="hello there", max_tokens=8,
                                                                extra_body={"ignore_eos": True})
        backends.add(raw.headers["x-flotilla-backend"])
        comp = raw.parse()
        assert comp.usage.completion_tokens == 8 and comp.choices[0].text
    assert backends == {e.url for e in engines}
    stream = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=6, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    pieces, usage = 0, None
    async for chunk in stream:
        pieces += sum(1 for c in chunk.choices if c.delta.content)
        usage = chunk.usage or usage
    assert usage.completion_tokens == 6 and pieces >= 1
    assert sum(b.prefill_tokens for b in p.proxy.pool) > 0  # usage fed the prefill accounting
    await client.close()


async def test_first_chunk_reaches_the_client_before_a_slow_engine_finishes(vllm_fleet,
                                                                           proxy_for: ProxyFactory) -> None:
    engine = Url((await vllm_fleet(1, time_scale=1.0))[0].port)
    p = await proxy_for([engine])
    client = openai.AsyncOpenAI(base_url=p.url + "/v1", api_key="unused", max_retries=0)
    t0 = time.monotonic()
    stream = await client.completions.create(model=MODEL, prompt="tell me", max_tokens=100, stream=True,
                                             extra_body={"ignore_eos": True})
    first = last = None
    async for _ in stream:
        first = first or time.monotonic()
        last = time.monotonic()
    assert first - t0 < (last - t0) / 2  # 100 decode steps: the first token came early
    await client.close()


async def test_client_disconnect_brings_vllm_running_back_to_zero_within_a_second(
        vllm_fleet, proxy_for: ProxyFactory) -> None:
    engine = Url((await vllm_fleet(1, time_scale=1.0))[0].port)
    p = await proxy_for([engine])
    body = {"model": MODEL, "prompt": "long answer", "max_tokens": 3000, "ignore_eos": True, "stream": True}
    async with aiohttp.ClientSession() as s:
        resp = await s.post(p.url + "/v1/completions", json=body)
        await resp.content.readany()
        assert await running_requests(engine.url) == 1.0
        resp.close()
    left_at = time.monotonic()
    while await running_requests(engine.url) != 0.0:
        assert time.monotonic() - left_at < 1.0
        await asyncio.sleep(0.02)
