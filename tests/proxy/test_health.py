"""Probes move backends between starting, ready and ejected; the breaker closes again on success."""

import asyncio
import time

import aiohttp

from policies.routing.base import BackendState
from proxy.config import BackendSpec, BreakerConfig, HealthConfig
from tests.proxy.conftest import BackendFactory, FakeBackend, ProxyFactory, free_port

SLOW_LOOP = HealthConfig(interval_s=100.0, timeout_s=0.5)  # probes are driven by hand below
LOADING = b'{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}'


async def test_llama_server_loading_stays_starting_then_becomes_ready(
        fake_backend: BackendFactory, proxy_for: ProxyFactory) -> None:
    b = await fake_backend(health_status=503, health_body=LOADING)
    p = await proxy_for([b], health=SLOW_LOOP)
    backend = p.proxy.pool.backends[0]
    for _ in range(5):  # never counted as failures, however long it loads
        await p.proxy.health.check_all()
    assert backend.state is BackendState.STARTING and backend.breaker.failures == 0
    b.knobs.health_status = 200
    await p.proxy.health.check_all()
    assert backend.state is BackendState.READY


async def test_vllm_refusing_connections_while_loading_is_starting_not_failed(proxy_for: ProxyFactory) -> None:
    port = free_port()
    late = FakeBackend(name="late", port=port)
    p = await proxy_for([late], health=SLOW_LOOP)
    backend = p.proxy.pool.backends[0]
    for _ in range(3):
        await p.proxy.health.check_all()
    assert backend.state is BackendState.STARTING and backend.breaker.failures == 0
    await late.start(port)
    try:
        await p.proxy.health.check_all()
        assert backend.state is BackendState.READY
        assert backend.discovered_models == frozenset({"tiny-llama"})
    finally:
        await late.stop()


async def test_failing_probes_eject_and_successes_after_the_open_time_restore(
        fake_backend: BackendFactory, proxy_for: ProxyFactory) -> None:
    b = await fake_backend()
    p = await proxy_for([b], health=SLOW_LOOP,
                        breaker=BreakerConfig(failure_threshold=2, success_threshold=2, open_s=0.2))
    backend = p.proxy.pool.backends[0]
    now_s = [0.0]
    p.proxy.health.clock = lambda: now_s[0]  # the breaker's open time passes in test time, not by waiting
    b.knobs.health_status = 500
    await p.proxy.health.check_all()
    assert backend.state is BackendState.READY
    await p.proxy.health.check_all()
    assert backend.state is BackendState.EJECTED
    b.knobs.health_status = 200
    await p.proxy.health.check_all()  # still open: not even probed
    assert backend.state is BackendState.EJECTED
    now_s[0] += 0.25  # past open_s: half-open
    await p.proxy.health.check_all()
    assert backend.state is BackendState.EJECTED  # one half-open success of the two needed
    await p.proxy.health.check_all()
    assert backend.state is BackendState.READY
    async with aiohttp.ClientSession() as s:
        async with s.get(p.url + "/metrics") as r:
            assert f'flotilla_backend_ejections_total{{backend="{b.url}"}} 1.0' in await r.text()


async def test_a_probe_that_times_out_while_the_proxy_is_stalled_ejects_nobody(proxy_for: ProxyFactory) -> None:
    held: list[asyncio.StreamWriter] = []

    def accept_and_stall(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # Never answer, and hold the proxy's loop (this server shares it) past the probe's
        # timeout, as a GC pause or a starved CPU would: the timer fires late, and the backend's
        # silence proves nothing. The probe's timer is running by now: it connected.
        held.append(writer)
        time.sleep(0.3)

    server = await asyncio.start_server(accept_and_stall, "127.0.0.1", 0)
    try:
        p = await proxy_for([BackendSpec(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")],
                            health=HealthConfig(interval_s=100.0, timeout_s=0.05),
                            breaker=BreakerConfig(failure_threshold=1, success_threshold=1, open_s=10.0))
        backend = p.proxy.pool.backends[0]
        backend.state, backend.ever_ready = BackendState.READY, True
        for _ in range(3):
            await p.proxy.health.check_all()
        assert len(held) >= 3  # every round's probe reached it and stalled
        assert backend.state is BackendState.READY and backend.breaker.failures == 0
    finally:
        for w in held:
            w.close()
        server.close()


async def test_failing_requests_eject_a_backend_and_traffic_moves_away(
        fake_backend: BackendFactory, proxy_for: ProxyFactory) -> None:
    bad = await fake_backend("bad", status=502)
    good = await fake_backend("good")
    p = await proxy_for([bad, good], policy="round-robin", health=SLOW_LOOP,
                        breaker=BreakerConfig(failure_threshold=2, success_threshold=1, open_s=60))
    async with aiohttp.ClientSession() as s:
        for _ in range(6):
            async with s.post(p.url + "/v1/completions", json={"model": "tiny-llama", "prompt": "x"}) as r:
                assert r.status == 200 and r.headers["x-flotilla-backend"] == good.url
    assert p.proxy.pool.backends[0].state is BackendState.EJECTED
    assert bad.received == 2  # ejected after two failures, then left alone


async def test_a_server_without_a_health_route_is_probed_on_its_models(
        fake_backend: BackendFactory, proxy_for: ProxyFactory) -> None:
    b = await fake_backend(health_status=404)
    p = await proxy_for([b], health=SLOW_LOOP)
    assert p.proxy.pool.backends[0].state is BackendState.READY
    await b.stop()
    await p.proxy.health.check_all()
    assert p.proxy.pool.backends[0].breaker.failures == 1
