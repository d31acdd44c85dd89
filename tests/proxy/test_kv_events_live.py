"""Live: the proxy's KV index against look-alike vLLM engines that publish KV-cache events over
ZMQ (`--kv-events-config`), on real 127.0.0.1 sockets; the engines' dev-mode
`GET /debug/kv_cache` says what their prefix caches really hold."""

from __future__ import annotations

import asyncio
import json
import random
import socket
import subprocess
import sys

import aiohttp
import pytest
import yaml

from flotilla.fleet import EngineGroup, Fleet
from flotilla.testing.live import LiveFleet
from policies.routing.kv_index import KVIndex
from proxy.app import start_proxy
from proxy.config import BackendSpec, ProxyConfig
from proxy.workers import WORKER_HEADER
from tests.processes import kill_if_running, terminate
from tests.waiting import wait_until

BLOCKS = 48
"""GPU blocks per engine: a few long prompts fill it, so the workload evicts."""
BLOCK_SIZE = 16


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def group(name: str) -> EngineGroup:
    events = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{free_port()}",
              "replay_endpoint": f"tcp://*:{free_port()}", "topic": "kv"}
    return EngineGroup(flavor="vllm", model="llama-3.1-8b", name=name, time_scale=0.01,
                       args=("--num-gpu-blocks-override", str(BLOCKS), "--block-size", str(BLOCK_SIZE), "--max-model-len", "512",
                             "--kv-events-config", json.dumps(events)))


@pytest.fixture
async def fleet(monkeypatch):
    monkeypatch.setenv("VLLM_SERVER_DEV_MODE", "1")
    live = await LiveFleet.start(Fleet(engines=(group("a"), group("b")), policy="precise-prefix"))
    yield live
    await live.close()


def text(seed: int, blocks: int) -> str:
    """A prompt of `blocks` full blocks of the look-alike tokenizer (4 characters a token)."""
    rng = random.Random(seed)
    return "".join(rng.choice("abcdefghij ") for _ in range(blocks * BLOCK_SIZE * 4))


async def complete(session: aiohttp.ClientSession, url: str, prompt: str) -> str:
    """Send one completion; the backend the proxy chose (or the engine's own URL)."""
    body = {"model": "llama-3.1-8b", "prompt": prompt, "max_tokens": 2}
    async with session.post(f"{url}/v1/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        await resp.read()
        return resp.headers.get("x-flotilla-backend", url)


async def engine_cache(session: aiohttp.ClientSession, url: str) -> set[int]:
    async with session.get(f"{url}/debug/kv_cache") as resp:
        assert resp.status == 200, await resp.text()
        data = await resp.json()
    return set(data["block_hashes"])


async def index_matches_engines(session: aiohttp.ClientSession, index: KVIndex, urls: list[str]) -> bool:
    for url in urls:
        if index.engine_hashes(url) != await engine_cache(session, url):
            return False
    return True


def kv_index(live: LiveFleet) -> KVIndex:
    return live.proxy.proxy.kv_index


async def test_after_a_workload_with_evictions_the_index_equals_each_engines_cache(fleet):
    async with aiohttp.ClientSession() as session:
        for seed in range(0, 16, 2):  # 16 prompts of 10 blocks through 2 x 48 blocks: evictions
            # two at a time through the proxy, and every fourth prompt straight to the second engine,
            # so both engines fill and evict however the proxy spreads the pairs
            targets = (fleet.url, fleet.engine_urls[1] if seed % 4 == 0 else fleet.url)
            await asyncio.gather(*(complete(session, t, text(seed + i, 10)) for i, t in enumerate(targets)))
        index = kv_index(fleet)
        await wait_until(lambda: all(index.stats(u).removed_blocks > 0 for u in fleet.engine_urls),
                         what="evictions on both engines")
        await wait_until(lambda: index_matches_engines(session, index, fleet.engine_urls),
                         what="the router's index equal to each engine's /debug/kv_cache")
        assert all(index.size(u) > 0 for u in fleet.engine_urls)


async def test_a_prompt_one_engine_served_directly_is_routed_back_to_it(fleet):
    # the second engine caches the prompt without the proxy's knowledge: only its events tell
    prompt = text(99, 8)
    second = fleet.engine_urls[1]
    async with aiohttp.ClientSession() as session:
        await complete(session, second, prompt)
        index = kv_index(fleet)
        await wait_until(lambda: index.size(second) >= 8, what="the engine's blocks in the index")
        for _ in range(3):
            assert await complete(session, fleet.url, prompt) == second
    assert 'rule="precise-match"' in (await _metrics(fleet.url))


async def _metrics(url: str) -> str:
    async with aiohttp.ClientSession() as session, session.get(f"{url}/metrics") as resp:
        return await resp.text()


async def _cache_behind_the_proxies(session: aiohttp.ClientSession, fleet) -> tuple[list[str], list[str]]:
    """Five prompts: four served by the engines directly (cached behind the proxies' backs), the last
    routed by the in-process proxy. Returns them and the engine each should be routed to from now on."""
    a, b = fleet.engine_urls
    prompts = [text(seed, 6) for seed in range(5)]
    for prompt, engine in zip(prompts, (a, b, b, a), strict=False):
        await complete(session, engine, prompt)
    chosen = await complete(session, fleet.proxy.url, prompts[4])
    return prompts, [a, b, b, a, chosen]


async def test_two_proxies_fed_by_the_same_events_make_the_same_decision(fleet):
    first = fleet.proxy
    backends = [BackendSpec(url=u, flavor="vllm", models=("llama-3.1-8b",), kv_events=g.kv_events())
                for u, g in zip(fleet.engine_urls, fleet.fleet.started(), strict=True)]
    second = await start_proxy(ProxyConfig(port=0, policy="precise-prefix", backends=backends))
    try:
        async with aiohttp.ClientSession() as session:
            prompts, expected = await _cache_behind_the_proxies(session, fleet)
            for proxy in (first.proxy, second.proxy):
                await wait_until(lambda p=proxy: index_matches_engines(session, p.kv_index, fleet.engine_urls),
                                 what="each proxy's index equal to the engines' caches")
            assert [await complete(session, first.url, p) for p in prompts] == expected
            assert [await complete(session, second.url, p) for p in prompts] == expected
    finally:
        await second.close()


async def test_two_proxy_processes_fed_by_the_same_events_make_the_same_decision(fleet, tmp_path):
    # The in-process proxy above and a `flotilla proxy --workers 2` subprocess: three processes,
    # each subscribed to the engines' events itself, each hashing prompts with its own interpreter.
    first = fleet.proxy
    backends = [{"url": u, "flavor": "vllm", "models": ["llama-3.1-8b"],
                 "kv_events": {"endpoint": g.kv_events().endpoint, "replay_endpoint": g.kv_events().replay_endpoint,
                               "topic": g.kv_events().topic}}
                for u, g in zip(fleet.engine_urls, fleet.fleet.started(), strict=True)]
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump({"policy": "precise-prefix", "backends": backends}))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "flotilla", "proxy", "--port", "0", "--workers", "2",
        "--config", str(tmp_path / "fleet.yaml"), stdout=subprocess.PIPE)
    try:
        second = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode().split()[4]
        async with aiohttp.ClientSession() as session:
            prompts, expected = await _cache_behind_the_proxies(session, fleet)
            index = first.proxy.kv_index
            await wait_until(lambda: index_matches_engines(session, index, fleet.engine_urls),
                             what="the in-process index equal to the engines' caches")
            in_sync: set[str] = set()

            async def both_workers_in_sync() -> bool:  # each worker's index holds what this one does
                async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as fresh:
                    async with fresh.get(second + "/metrics") as resp:
                        blocks = {line.split('"')[1]: float(line.rsplit(" ", 1)[1])
                                  for line in (await resp.text()).splitlines()
                                  if line.startswith("flotilla_kv_index_blocks{")}
                        if blocks == {u: float(index.size(u)) for u in fleet.engine_urls}:
                            in_sync.add(resp.headers[WORKER_HEADER])
                return len(in_sync) == 2

            await wait_until(both_workers_in_sync, what="both workers' indexes as full as the in-process one")
            assert [await complete(session, first.url, p) for p in prompts] == expected
            answered = []
            for p in prompts:  # new connections: either worker may answer each
                async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as fresh:
                    answered.append(await complete(fresh, second, p))
            assert answered == expected
        assert await terminate(proc, 60) == 0
    finally:
        await kill_if_running(proc)
