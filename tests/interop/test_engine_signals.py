"""The scraper reads real engines' metric families into routing and autoscaling signals."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from policies.scaling.base import ScalingSignals
from proxy.autoscale.signals import ArrivalCounter, PoolSignals
from tests.interop.engines import Engine
from tests.interop.wire import completion_body, parse_samples, post, scrape, total
from tests.waiting import wait_until

LONG = 6000
"""Tokens per long request (ignore_eos): seconds of decoding, so the scraper sees it running."""
SIGNAL_WAIT_S = 120.0


def long_streams(client: aiohttp.ClientSession, url: str, n: int) -> list[asyncio.Task]:
    body = completion_body
    return [asyncio.create_task(post(client, url, "/v1/completions",
                                     body(f"load {i}: " + "red green blue " * 10, max_tokens=LONG, stream=True,
                                          ignore_eos=True)))
            for i in range(n)]


async def cancel(tasks: list[asyncio.Task]) -> None:
    """Client disconnects: cancelling the reads closes the connections."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def pool_signals(running) -> ScalingSignals:
    return await PoolSignals(running.proxy.pool, ArrivalCounter()).sample(0.0)


@pytest.mark.parametrize("flavor", ["vllm", "llama"])
async def test_scraper_sees_real_running_and_waiting_past_the_engines_limit(flavor, request, proxy_in_front,
                                                                            client):
    """Four long requests at one engine that runs two at once (--max-num-seqs 2, -np 2): the
    proxy's scraped sample says 2 running and waiting ones, the autoscaler's pool signals sum them,
    and both fall back to 0 once the clients go away."""
    engine: Engine = request.getfixturevalue(f"{flavor}_pair")[0]
    running = await proxy_in_front([engine])
    backend = running.proxy.pool.find(engine.url)
    tasks = long_streams(client, running.url, 4)
    try:
        def busy():
            s = backend.sample
            return s if s and s.num_requests_running == 2 and (s.num_requests_waiting or 0) >= 1 else None

        sample = await wait_until(busy, SIGNAL_WAIT_S, poll_s=0.05, what=f"{engine.name} 2 running, >=1 waiting")
        signals = await pool_signals(running)
        if flavor == "vllm":
            assert sample.kv_cache_usage is not None and sample.kv_cache_usage > 0
            assert signals.num_requests_running == 2 and signals.num_requests_waiting >= 1
            assert signals.kv_cache_usage == sample.kv_cache_usage
        else:
            assert signals.requests_processing == 2 and signals.requests_deferred >= 1
    finally:
        await cancel(tasks)
    idle = await wait_until(lambda: backend.sample and backend.sample.num_requests_running == 0
                            and not backend.sample.num_requests_waiting, SIGNAL_WAIT_S, poll_s=0.05,
                            what="the engine idle again after the clients left")
    assert idle


async def test_scraper_reads_vllm_cache_capacity_from_cache_config_info(vllm_pair, proxy_in_front, client):
    engine = vllm_pair[0]
    running = await proxy_in_front([engine])
    backend = running.proxy.pool.find(engine.url)
    await wait_until(lambda: backend.sample is not None, what="a first scrape")
    async with client.get(engine.url + "/metrics") as resp:
        text = await resp.text()
    info = [line for line in text.splitlines() if line.startswith("vllm:cache_config_info{")][0]
    labels = dict(part.split("=", 1) for part in info[info.index("{") + 1:info.rindex("}")].split(","))
    blocks, block_size = int(labels["num_gpu_blocks"].strip('"')), int(labels["block_size"].strip('"'))
    assert backend.sample.cache_capacity_tokens == blocks * block_size > 0


@pytest.mark.parametrize("flavor, hits", [("vllm", "vllm:prefix_cache_hits_total"),
                                          ("llama", "llamacpp:prompt_tokens_cached_total")])
async def test_scraper_follows_the_real_prefix_cache_counters(flavor, hits, request, proxy_in_front, client):
    """The same long prompt twice: the engine's own prefix-cache counter moves, the proxy's sample
    of it moves by the same amount, and the engine's usage reports the cached tokens."""
    engine: Engine = request.getfixturevalue(f"{flavor}_pair")[0]
    running = await proxy_in_front([engine])
    backend = running.proxy.pool.find(engine.url)
    await wait_until(lambda: backend.sample is not None, what="a first scrape")
    prompt = f"{flavor} prefix: " + "the quick brown fox jumps over the lazy dog " * 40  # > 2 vLLM blocks of 128
    first = await post(client, running.url, "/v1/completions", completion_body(prompt, max_tokens=2))
    assert first.status == 200
    before = total(await scrape(client, engine.url), hits)
    await wait_until(lambda: backend.sample.metrics.get(hits) == before, poll_s=0.05,
                     what="the proxy's sample caught up with the engine")
    again = await post(client, running.url, "/v1/completions", completion_body(prompt, max_tokens=2))
    cached = again.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    after = total(await scrape(client, engine.url), hits)
    assert cached > 0 and after - before == cached
    await wait_until(lambda: backend.sample.metrics.get(hits) == after, poll_s=0.05,
                     what="the proxy's sample of the prefix-cache counter")


def test_samples_parse_a_metrics_page():
    """The suite's own reader (no engine needed, but marked interop with the rest)."""
    samples = parse_samples('# TYPE a counter\na_total{x="1"} 2\na_total{x="2"} 3\n')
    assert total(samples, "a_total") == 5 and total(samples, "a_total", x="2") == 3
