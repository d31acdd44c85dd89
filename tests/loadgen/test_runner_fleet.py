"""Replay against a local fleet: two look-alike vLLM engines behind the Flotilla router."""

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fake_engines.vllm.config import VllmServeConfig
from fake_engines.vllm.server import start_vllm
from loadgen.readers import read_trace
from loadgen.runner import OpenLoopRunner, RunnerConfig
from proxy.app import start_proxy
from proxy.config import BackendSpec, HealthConfig, ProxyConfig
from tests.conftest import REPO

DATA = REPO / "tests" / "data" / "traces"
MODEL = "tiny-llama"


@pytest.fixture
async def fleet():
    engines = []
    for _ in range(2):
        config = VllmServeConfig(model="llama-3.1-8b", served_model_name=MODEL, port=0, time_scale=0.05,
                                 enable_prompt_tokens_details=True, max_model_len=131072)
        engines.append(await start_vllm(config, cold_start=False))
    for engine in engines:
        await engine.wait_ready()
    urls = [f"http://127.0.0.1:{e.port}" for e in engines]
    proxy = await start_proxy(ProxyConfig(port=0, policy="round-robin", backends=[BackendSpec(url=u) for u in urls],
                                          scrape_interval_s=0.1, health=HealthConfig(interval_s=0.2)))
    yield proxy.url, urls
    await proxy.close()
    for engine in engines:
        await engine.close()


async def _counter(url: str, name: str) -> float:
    async with aiohttp.ClientSession() as session, session.get(url + "/metrics") as resp:
        text = await resp.text()
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


async def test_a_minute_of_azure_at_speedup_10_through_the_router_matches_the_engines_token_counters(fleet):
    proxy_url, engine_urls = fleet
    cfg = RunnerConfig(target_url=proxy_url, model=MODEL, speedup=10, show_progress=False,
                       replicas_url=proxy_url + "/metrics", replicas_interval_s=0.2)
    trace = list(read_trace(DATA / "azure_code.first60s.csv"))
    result = await OpenLoopRunner(cfg).run(trace)
    s = result.summary
    assert (s.num_requests, s.num_ok) == (63, 63), [r.error for r in result.requests if not r.ok][:3]
    # usage summed over the responses equals what the trace asked for and what the engines counted
    assert s.total_prompt_tokens == sum(r.input_length for r in trace)
    assert s.total_completion_tokens == sum(r.output_length for r in trace) == 1478
    prompt_counted = sum([await _counter(u, "vllm:prompt_tokens_total") for u in engine_urls])
    generated_counted = sum([await _counter(u, "vllm:generation_tokens_total") for u in engine_urls])
    assert (s.total_prompt_tokens, s.total_completion_tokens) == (prompt_counted, generated_counted)
    # round-robin over two engines, named by the router's x-flotilla-backend header
    assert set(s.requests_per_backend) == set(engine_urls)
    assert sorted(s.requests_per_backend.values()) == [31, 32]
    assert s.ttft_s.p50 > 0 and s.tpot_s.p50 > 0 and s.e2e_s.p99 >= s.e2e_s.p50
    assert s.total_cached_tokens == 0  # Azure rows carry no prefix information, so nothing is shared
    # the router's metrics report both engines ready throughout the run
    assert len(result.replicas) >= 5 and {n for _, n in result.replicas} == {2}


async def test_mooncake_hash_ids_become_prefix_cache_hits_on_the_engines(fleet):
    proxy_url, _ = fleet
    cfg = RunnerConfig(target_url=proxy_url, model=MODEL, speedup=10, max_requests=26, show_progress=False)
    trace = list(read_trace(DATA / "mooncake_conversation.first60s.jsonl"))[:26]
    result = await OpenLoopRunner(cfg).run(trace)
    s = result.summary
    assert s.num_ok == 26, [r.error for r in result.requests if not r.ok][:3]
    assert s.total_prompt_tokens == sum(r.input_length for r in trace)
    # every request starts with Mooncake's shared block 0 (512 tokens), so each engine reuses it
    assert s.total_cached_tokens >= (26 - 2 * 10) * 512 and s.prefix_hit_rate > 0
