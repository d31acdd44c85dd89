"""The proxy in front of look-alike vLLM engines with faults injected (real sockets, time-scaled)."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import pytest

from fake_engines.driver.faults import FaultConfig, FaultInjector
from fake_engines.vllm.config import VllmServeConfig
from fake_engines.vllm.server import start_vllm
from policies.routing.base import BackendState
from proxy.breaker import CircuitState
from proxy.config import BackendSpec, BreakerConfig, TimeoutConfig
from tests.waiting import wait_until

MODEL = "tiny-llama"
BODY = {"model": MODEL, "prompt": "tell me a story", "max_tokens": 8, "ignore_eos": True}


@pytest.fixture
async def engine():
    """engine(FaultConfig | None) -> (BackendSpec, running) of a started look-alike vLLM."""
    started = []

    async def start(faults: FaultConfig | None = None):
        config = VllmServeConfig(model="llama-3.1-8b", served_model_name=MODEL, port=0, time_scale=0.01,
                                 max_model_len=4096)
        running = await start_vllm(config, cold_start=False, faults=FaultInjector(faults))
        await running.wait_ready()
        started.append(running)
        return BackendSpec(f"http://127.0.0.1:{running.port}", "vllm"), running

    yield start
    for running in started:
        await running.close()


async def call(session: aiohttp.ClientSession, base: str, body: dict | None = None,
               timeout_s: float = 20.0) -> tuple[int, str, str]:
    """(status, backend header, body text) of one completion through the proxy."""
    async with session.post(base + "/v1/completions", json=body or BODY,
                            timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
        return resp.status, resp.headers.get("x-flotilla-backend", ""), await resp.text()


async def set_faults(url: str, **faults: object) -> None:
    async with aiohttp.ClientSession() as s, s.post(url + "/admin/faults", json=faults) as resp:
        assert resp.status == 200


async def test_error_before_first_byte_is_retried_on_another_backend_and_the_client_never_sees_it(
        engine, proxy_for):
    bad, _ = await engine(FaultConfig(error_status=503, error_rate=1.0))
    good, _ = await engine()
    p = await proxy_for([bad, good], breaker=BreakerConfig(failure_threshold=2, success_threshold=1, open_s=60))
    async with aiohttp.ClientSession() as s:
        results = [await call(s, p.url, {**BODY, "stream": i % 2 == 1}) for i in range(12)]
    assert [(status, backend) for status, backend, _ in results] == [(200, good.url)] * 12
    assert all("injected fault" not in text for _, _, text in results)
    failing = p.proxy.pool.find(bad.url)
    assert failing.state is BackendState.EJECTED
    assert failing.breaker.state is CircuitState.OPEN


async def test_a_500_is_the_engine_answer_passed_through_and_counts_toward_ejection(engine, proxy_for):
    # A 500 may be this request's own fault: it is not retried (see proxy/retry.py), only counted.
    bad, _ = await engine(FaultConfig(error_status=500, error_rate=1.0))
    p = await proxy_for([bad], breaker=BreakerConfig(failure_threshold=2, success_threshold=1, open_s=60))
    async with aiohttp.ClientSession() as s:
        first = [await call(s, p.url) for _ in range(2)]
        after = await call(s, p.url)
    assert [(status, json.loads(text)["error"]["message"]) for status, _, text in first] == \
        [(500, "injected fault: 500")] * 2
    assert p.proxy.pool.find(bad.url).state is BackendState.EJECTED
    assert after[0] == 503 and json.loads(after[2])["error"]["type"] == "unavailable_error"


async def test_ejected_backend_is_readmitted_through_half_open_probes_once_healthy(engine, proxy_for):
    bad, _ = await engine(FaultConfig(error_status=503, error_rate=1.0))
    good, _ = await engine()
    p = await proxy_for([bad, good], breaker=BreakerConfig(failure_threshold=2, success_threshold=2, open_s=0.5))
    failing = p.proxy.pool.find(bad.url)
    async with aiohttp.ClientSession() as s:
        for _ in range(6):
            assert (await call(s, p.url))[0] == 200
            if failing.state is BackendState.EJECTED:
                break
        assert failing.state is BackendState.EJECTED
        await set_faults(bad.url)  # healthy again
        await wait_until(lambda: failing.state is BackendState.READY, what="the healed backend readmitted")
        assert failing.breaker.state is CircuitState.CLOSED
        served_by = {(await asyncio.gather(*(call(s, p.url) for _ in range(2))))[i][1] for i in range(2)}
    assert bad.url in served_by


async def test_failure_mid_stream_ends_the_stream_with_an_error_event_and_done(engine, proxy_for):
    only, _ = await engine(FaultConfig(drop_after_tokens=3))
    p = await proxy_for([only])
    async with aiohttp.ClientSession() as s:
        status, backend, text = await call(s, p.url, {**BODY, "max_tokens": 20, "stream": True})
    assert status == 200 and backend == only.url
    events = [e.removeprefix("data: ") for e in text.split("\n\n") if e.strip()]
    assert len(events) == 5  # three relayed events, the error event, [DONE]
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["code"] == 502 and error["type"] == "bad_gateway_error"
    assert "broke mid-response" in error["message"]


async def test_hung_backend_hits_the_first_byte_timeout_while_other_requests_keep_flowing(engine, proxy_for):
    hung, _ = await engine(FaultConfig(hang=True))
    good, _ = await engine()
    p = await proxy_for([hung, good], timeouts=TimeoutConfig(connect_s=1.0, first_byte_s=2.5, idle_s=5.0,
                                                             total_s=20.0))
    hung_b = p.proxy.pool.find(hung.url)
    hung_b.state = BackendState.READY  # as if it hung after its last good probe
    async with aiohttp.ClientSession() as s:
        t0 = time.monotonic()
        first = [asyncio.create_task(call(s, p.url)) for _ in range(2)]
        # one held by the hung backend and the other answered before the others start, so least-outstanding
        # sends every later request to the good one
        await wait_until(lambda: hung_b.in_flight == 1 and any(t.done() for t in first),
                         what="one request held by the hung backend, the other answered")
        others = [await call(s, p.url) for _ in range(20)]
        others_done_s = time.monotonic() - t0
        results = await asyncio.gather(*first)
        hung_done_s = time.monotonic() - t0
    assert sorted((status, backend) for status, backend, _ in results) == [(200, good.url), (504, hung.url)]
    timeout_error = json.loads(next(text for status, _, text in results if status == 504))["error"]
    assert "first_byte_timeout" in timeout_error["message"]
    assert 2.5 <= hung_done_s < 8.0
    assert [(status, backend) for status, backend, _ in others] == [(200, good.url)] * 20
    assert others_done_s < hung_done_s


async def test_crashed_backend_request_is_retried_on_the_survivor(engine, proxy_for):
    crashing, _ = await engine(FaultConfig(exit_after_requests=1))
    good, _ = await engine()
    p = await proxy_for([crashing, good])
    async with aiohttp.ClientSession() as s:
        results = await asyncio.gather(*(call(s, p.url, {**BODY, "stream": True}) for _ in range(6)))
        later = [await call(s, p.url) for _ in range(6)]
    assert all(status == 200 and text.rstrip().endswith("data: [DONE]") for status, _, text in results)
    assert [status for status, _, _ in later] == [200] * 6
    assert {backend for _, backend, _ in later} == {good.url}


async def test_refused_connections_are_retried_on_another_backend(engine, proxy_for):
    refusing, _ = await engine()
    good, _ = await engine()
    p = await proxy_for([refusing, good])
    await set_faults(refusing.url, refuse_s=60)
    async with aiohttp.ClientSession() as s:
        results = [await call(s, p.url) for _ in range(8)]
    assert [(status, backend) for status, backend, _ in results] == [(200, good.url)] * 8


async def test_429_from_a_busy_backend_is_retried_and_does_not_eject_it(engine, proxy_for):
    busy, _ = await engine(FaultConfig(error_status=429, error_rate=1.0))
    good, _ = await engine()
    p = await proxy_for([busy, good])
    async with aiohttp.ClientSession() as s:
        results = [await call(s, p.url) for _ in range(8)]
    assert [(status, backend) for status, backend, _ in results] == [(200, good.url)] * 8
    assert p.proxy.pool.find(busy.url).breaker.state is CircuitState.CLOSED


@pytest.mark.serial  # how many requests the slow backend gets depends on timing: needs the machine to itself
async def test_a_slow_backend_gets_fewer_requests_and_none_fails(engine, proxy_for):
    slow, _ = await engine(FaultConfig(slow_factor=40.0))
    fast, _ = await engine()
    p = await proxy_for([slow, fast])

    async def worker(s: aiohttp.ClientSession) -> list[tuple[int, str, str]]:
        return [await call(s, p.url, {**BODY, "max_tokens": 16}) for _ in range(10)]

    async with aiohttp.ClientSession() as s:
        results = [r for rs in await asyncio.gather(*(worker(s) for _ in range(3))) for r in rs]
    assert all(status == 200 for status, _, _ in results)
    by_backend = [backend for _, backend, _ in results]
    assert by_backend.count(fast.url) > by_backend.count(slow.url)


async def test_a_llama_server_dropping_streams_ends_them_with_an_error_event_and_is_ejected(proxy_for):
    from fake_engines.llamacpp.config import LlamaServerConfig
    from fake_engines.llamacpp.server import start_llama

    config = LlamaServerConfig(model="llama-3.1-8b-Q4_K_M.gguf", port=0, time_scale=0.01, n_parallel=2)
    running = await start_llama(config, cold_start=False, faults=FaultInjector(FaultConfig(drop_after_tokens=2)))
    try:
        await running.wait_ready()
        spec = BackendSpec(f"http://127.0.0.1:{running.port}", "llamacpp")
        p = await proxy_for([spec], breaker=BreakerConfig(failure_threshold=2, success_threshold=1, open_s=60))
        async with aiohttp.ClientSession() as s:
            for _ in range(2):
                status, _, text = await call(s, p.url, {**BODY, "max_tokens": 16, "stream": True})
                assert status == 200 and text.rstrip().endswith("data: [DONE]")
                assert json.loads(text.split("\n\n")[-3].removeprefix("data: "))["error"]["code"] == 502
        assert p.proxy.pool.find(spec.url).state is BackendState.EJECTED
    finally:
        await running.close()
