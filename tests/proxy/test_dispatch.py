"""Forwarding under failure: disconnects, dead backends, retries, timeouts, bursts."""

import asyncio
import base64
import collections
import json
import logging
import sys
import time

import aiohttp
import pytest

from policies.routing.base import BackendState
from proxy.config import BackendSpec, BreakerConfig, HealthConfig, RetryConfig, TimeoutConfig
from proxy.limits import LimitsConfig
from tests.proxy.conftest import BackendFactory, ProxyFactory, free_port
from tests.waiting import wait_until

BODY = {"model": "tiny-llama", "prompt": "hello"}


async def _sse_events(resp: aiohttp.ClientResponse) -> list[str]:
    raw = (await resp.read()).decode()
    return [e.removeprefix("data: ") for e in raw.split("\n\n") if e.startswith("data: ")]


async def test_client_disconnect_cancels_the_upstream_request_within_a_second(
        fake_backend: BackendFactory, proxy_for: ProxyFactory) -> None:
    b = await fake_backend(chunks=100, chunk_delay_s=0.05)
    p = await proxy_for([b])
    async with aiohttp.ClientSession() as s:
        resp = await s.post(p.url + "/v1/completions", json={**BODY, "stream": True})
        await resp.content.readany()
        assert b.running == 1
        resp.close()
        left_at = time.monotonic()
        await wait_until(lambda: b.running == 0, what="the upstream request cancelled")
    assert b.cancelled == 1
    assert b.cancelled_at[0] - left_at < 1.0
    assert p.proxy.pool.backends[0].in_flight == 0


async def test_client_disconnect_while_waiting_for_the_first_byte_cancels_upstream(
        fake_backend: BackendFactory, proxy_for: ProxyFactory) -> None:
    b = await fake_backend(first_byte_delay_s=30)
    p = await proxy_for([b])
    async with aiohttp.ClientSession() as s:
        task = asyncio.create_task(s.post(p.url + "/v1/completions", json=BODY))
        await wait_until(lambda: b.running, what="the request reached the backend")
        task.cancel()
        left_at = time.monotonic()
        await wait_until(lambda: not b.running, what="the upstream request cancelled")
    assert b.cancelled == 1 and b.cancelled_at[0] - left_at < 1.0


async def test_backend_dying_before_the_first_byte_is_retried_on_another(
        fake_backend: BackendFactory, proxy_for: ProxyFactory) -> None:
    dead = await fake_backend("dead", die_before_first_byte=True)
    good = await fake_backend("good")
    p = await proxy_for([dead, good], policy="round-robin")
    async with aiohttp.ClientSession() as s:
        async with s.post(p.url + "/v1/completions", json=BODY) as r:
            assert r.status == 200
            assert r.headers["x-flotilla-backend"] == good.url
            assert (await r.json())["choices"][0]["text"].startswith("good-0")
    assert dead.received == 1 and good.received == 1


async def test_backend_stopped_entirely_is_retried_on_another(
        fake_backend: BackendFactory, proxy_for: ProxyFactory) -> None:
    gone = await fake_backend("gone")
    good = await fake_backend("good")
    p = await proxy_for([gone, good], policy="round-robin")
    await gone.stop()  # connections are now refused
    async with aiohttp.ClientSession() as s:
        for _ in range(2):
            async with s.post(p.url + "/v1/completions", json=BODY) as r:
                assert r.status == 200 and r.headers["x-flotilla-backend"] == good.url
        async with s.get(p.url + "/metrics") as r:
            assert 'flotilla_retries_total{reason="connect"}' in await r.text()


async def test_backend_dying_mid_stream_ends_the_stream_with_an_error_event_and_done(
        fake_backend: BackendFactory, proxy_for: ProxyFactory) -> None:
    b = await fake_backend("dies", chunks=10, die_after_chunks=3)
    other = await fake_backend("other")
    p = await proxy_for([b, other], policy="round-robin")
    async with aiohttp.ClientSession() as s:
        async with asyncio.timeout(5):
            async with s.post(p.url + "/v1/chat/completions", json={
                    "model": "tiny-llama", "messages": [{"role": "user", "content": "x"}], "stream": True}) as r:
                assert r.status == 200 and r.headers["x-flotilla-backend"] == b.url
                events = await _sse_events(r)
    assert len(events) == 5
    assert [json.loads(e)["choices"][0]["delta"]["content"] for e in events[:3]] == ["dies-0 ", "dies-1 ", "dies-2 "]
    assert json.loads(events[3])["error"]["type"] == "bad_gateway_error"
    assert events[4] == "[DONE]"
    assert other.received == 0  # never retried once streaming began


async def test_a_json_body_cut_short_becomes_a_502_error_not_a_truncated_answer(
        fake_backend: BackendFactory, proxy_for: ProxyFactory) -> None:
    b = await fake_backend(truncate_body=True)
    p = await proxy_for([b])
    async with aiohttp.ClientSession() as s:
        async with s.post(p.url + "/v1/completions", json=BODY) as r:
            assert r.status == 502 and r.headers["x-flotilla-backend"] == b.url
            assert "mid-response" in (await r.json())["error"]["message"]


async def test_retryable_statuses_go_to_another_backend_and_429_retry_after_is_honoured(
        fake_backend: BackendFactory, proxy_for: ProxyFactory) -> None:
    busy = await fake_backend("busy", status=429, retry_after="0.15")
    good = await fake_backend("good")
    p = await proxy_for([busy, good], policy="round-robin")
    async with aiohttp.ClientSession() as s:
        t0 = time.monotonic()
        async with s.post(p.url + "/v1/completions", json=BODY) as r:
            assert r.status == 200 and r.headers["x-flotilla-backend"] == good.url
        assert time.monotonic() - t0 >= 0.15  # waited out the Retry-After (capped at 0.2 s)
    assert busy.received == 1


async def test_a_llama_server_reloading_its_model_is_starting_not_failed(
        fake_backend: BackendFactory, proxy_for: ProxyFactory) -> None:
    loading = await fake_backend("loading")
    good = await fake_backend("good")
    p = await proxy_for([loading, good], policy="round-robin", health=HealthConfig(interval_s=100, timeout_s=1))
    loading.knobs.status = 503
    loading.knobs.error_message = "Loading model"
    async with aiohttp.ClientSession() as s:
        async with s.post(p.url + "/v1/completions", json=BODY) as r:
            assert r.status == 200 and r.headers["x-flotilla-backend"] == good.url
    backend = p.proxy.pool.backends[0]
    assert backend.state is BackendState.STARTING and backend.breaker.failures == 0


async def test_a_500_is_not_retried(fake_backend: BackendFactory, proxy_for: ProxyFactory) -> None:
    bad = await fake_backend("bad", status=500)
    good = await fake_backend("good")
    p = await proxy_for([bad, good], policy="round-robin")
    async with aiohttp.ClientSession() as s:
        async with s.post(p.url + "/v1/completions", json=BODY) as r:
            assert r.status == 500 and r.headers["x-flotilla-backend"] == bad.url
            assert (await r.json())["error"]["message"] == "bad says 500"
    assert good.received == 0


async def test_when_every_backend_answers_503_the_last_answer_is_relayed(
        fake_backend: BackendFactory, proxy_for: ProxyFactory) -> None:
    one = await fake_backend("one", status=503)
    two = await fake_backend("two", status=503)
    p = await proxy_for([one, two], policy="round-robin", retry=RetryConfig(max_attempts=5, initial_backoff_s=0.01))
    async with aiohttp.ClientSession() as s:
        async with s.post(p.url + "/v1/completions", json=BODY) as r:
            assert r.status == 503
            assert (await r.json())["error"]["message"] == "two says 503"
    assert one.received == 1 and two.received == 1  # each backend tried once, never twice


async def test_first_byte_timeout_answers_504(fake_backend: BackendFactory, proxy_for: ProxyFactory) -> None:
    b = await fake_backend(first_byte_delay_s=5)
    p = await proxy_for([b], timeouts=TimeoutConfig(connect_s=1, first_byte_s=0.2, idle_s=1, total_s=10))
    async with aiohttp.ClientSession() as s:
        async with s.post(p.url + "/v1/completions", json=BODY) as r:
            assert r.status == 504
            assert "first_byte_timeout" in (await r.json())["error"]["message"]
    # the abandoned request was aborted on the backend too
    await wait_until(lambda: b.cancelled == 1, what="the backend saw the abandoned request cancelled")


async def test_idle_gap_between_chunks_ends_the_stream_with_an_error(
        fake_backend: BackendFactory, proxy_for: ProxyFactory) -> None:
    b = await fake_backend(chunks=3, chunk_delay_s=1.0)
    p = await proxy_for([b], timeouts=TimeoutConfig(connect_s=1, first_byte_s=2, idle_s=0.3, total_s=10))
    async with aiohttp.ClientSession() as s:
        async with asyncio.timeout(5):
            async with s.post(p.url + "/v1/completions", json={**BODY, "stream": True}) as r:
                events = await _sse_events(r)
    assert "idle" in json.loads(events[0])["error"]["message"]
    assert events[-1] == "[DONE]"


async def _burst(p_url: str, n: int) -> collections.Counter:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        async def one() -> str:
            async with s.post(p_url + "/v1/completions", json=BODY) as r:
                await r.read()
                return r.headers["x-flotilla-backend"]
        return collections.Counter(await asyncio.gather(*(one() for _ in range(n))))


async def test_burst_of_200_spreads_evenly_over_8_backends(fake_backend: BackendFactory,
                                                           proxy_for: ProxyFactory) -> None:
    backends = [await fake_backend(f"b{i}", chunks=2, chunk_delay_s=0.05) for i in range(8)]
    for policy in ("least-outstanding", "weighted"):
        p = await proxy_for(backends, policy=policy)
        counts = await _burst(p.url, 200)
        assert sum(counts.values()) == 200
        assert max(counts.values()) / (200 / 8) <= 1.25, (policy, counts)


async def _start_engine_process(port: int) -> asyncio.subprocess.Process:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "fake_engines.vllm.cli", "serve", "llama-3.1-8b", "--served-model-name", "tiny-llama",
        "--port", str(port), "--startup-seconds", "0", "--warmup-seconds", "0", "--load-gbps", "1000",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    async with aiohttp.ClientSession() as s:
        for _ in range(600):
            try:
                async with s.get(f"http://127.0.0.1:{port}/health") as r:
                    if r.status == 200:
                        return proc
            except aiohttp.ClientError:
                await asyncio.sleep(0.05)
    raise AssertionError("engine did not start")


async def test_engine_process_killed_mid_stream_and_the_next_request_goes_elsewhere(
        proxy_for: ProxyFactory) -> None:
    ports = [free_port(), free_port()]
    procs = [await _start_engine_process(port) for port in ports]
    try:
        p = await proxy_for([BackendSpec(f"http://127.0.0.1:{port}", "vllm") for port in ports], policy="round-robin")
        body = {"model": "tiny-llama", "prompt": "x", "max_tokens": 2000, "ignore_eos": True, "stream": True}
        async with aiohttp.ClientSession() as s:
            async with asyncio.timeout(10):
                async with s.post(p.url + "/v1/completions", json=body) as r:
                    victim = ports.index(int(r.headers["x-flotilla-backend"].rsplit(":", 1)[1]))
                    await r.content.readuntil(b"\n\n")
                    procs[victim].kill()  # SIGKILL: no goodbye, the kernel just closes its sockets
                    events = await _sse_events(r)
            assert json.loads(events[-2])["error"]["type"] == "bad_gateway_error" and events[-1] == "[DONE]"
            await procs[victim].wait()
            async with s.post(p.url + "/v1/completions", json={**body, "max_tokens": 4, "stream": False}) as r:
                assert r.status == 200 and r.headers["x-flotilla-backend"].endswith(str(ports[1 - victim]))
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


async def test_client_errors_a_backend_answers_never_count_toward_ejecting_it(
        fake_backend: BackendFactory, proxy_for: ProxyFactory) -> None:
    b = await fake_backend()
    p = await proxy_for([b], breaker=BreakerConfig(failure_threshold=1, success_threshold=1, open_s=60.0))
    async with aiohttp.ClientSession() as s:
        for status in (400, 404, 413, 422, 400, 404):
            b.knobs.status = status
            async with s.post(p.url + "/v1/completions", json=BODY) as r:
                assert r.status == status and r.headers["x-flotilla-backend"] == b.url
        backend = p.proxy.pool.find(b.url)
        assert backend.state is BackendState.READY and backend.breaker.failures == 0
        b.knobs.status = 500  # the backend's own fault still counts
        async with s.post(p.url + "/v1/completions", json=BODY) as r:
            assert r.status == 500
    assert backend.state is BackendState.EJECTED


SECRET = "s3cr%3At"  # "s3cr:t", percent-encoded as a URL's userinfo must be


async def test_url_credentials_go_upstream_as_basic_auth_and_show_nowhere(
        fake_backend: BackendFactory, proxy_for: ProxyFactory, caplog: pytest.LogCaptureFixture) -> None:
    basic = "Basic " + base64.b64encode(b"fleet:s3cr:t").decode()
    b = await fake_backend(required_authorization=basic)  # probes and scrapes need it too
    spec = BackendSpec(b.url.replace("http://", f"http://fleet:{SECRET}@"))
    p = await proxy_for([spec], admin_token="admin", limits=LimitsConfig(api_keys=("client-key",)))
    backend = p.proxy.pool.backends[0]
    await wait_until(lambda: backend.state is BackendState.READY, what="the backend ready through its credentials")
    with caplog.at_level(logging.DEBUG):
        async with aiohttp.ClientSession() as s:
            async with s.post(p.url + "/v1/completions", json=BODY,
                              headers={"Authorization": "Bearer client-key"}) as r:
                assert r.status == 200 and r.headers["x-flotilla-backend"] == b.url
            async with s.get(p.url + "/metrics") as r:
                metrics = await r.text()
            async with s.get(p.url + "/admin/backends", headers={"Authorization": "Bearer admin"}) as r:
                listed = await r.text()
            async with s.post(p.url + "/admin/backends", headers={"Authorization": "Bearer admin"},
                              json={"url": f"http://u:{SECRET}@127.0.0.1:{free_port()}"}) as r:
                added = await r.text()
                assert r.status == 201
    assert b.request_headers[-1]["Authorization"] == basic  # the client's key was replaced
    assert b.url in metrics and b.url in listed
    for shown in (metrics, listed, added, repr(p.proxy.pool.backends), caplog.text):
        assert "s3cr" not in shown and "fleet:" not in shown


async def test_a_backend_api_key_replaces_the_clients_key_and_without_keys_authorization_passes(
        fake_backend: BackendFactory, proxy_for: ProxyFactory) -> None:
    keyed = await fake_backend("keyed", required_authorization="Bearer backend-key")
    p = await proxy_for([BackendSpec(keyed.url, api_key="backend-key")],
                        limits=LimitsConfig(api_keys=("client-key",)))
    plain = await fake_backend("plain")
    q = await proxy_for([plain])  # no client keys: the client's Authorization is for the engine
    async with aiohttp.ClientSession() as s:
        await wait_until(lambda: p.proxy.pool.backends[0].state is BackendState.READY, what="keyed backend ready")
        async with s.post(p.url + "/v1/completions", json=BODY, headers={"Authorization": "Bearer client-key"}) as r:
            assert r.status == 200
        async with s.post(q.url + "/v1/completions", json=BODY, headers={"Authorization": "Bearer engine-key"}) as r:
            assert r.status == 200
    assert keyed.request_headers[-1]["Authorization"] == "Bearer backend-key"
    assert plain.request_headers[-1]["Authorization"] == "Bearer engine-key"


async def test_with_client_keys_and_no_backend_credentials_the_clients_key_is_not_forwarded(
        fake_backend: BackendFactory, proxy_for: ProxyFactory) -> None:
    b = await fake_backend()
    p = await proxy_for([b], limits=LimitsConfig(api_keys=("client-key",)))
    async with aiohttp.ClientSession() as s:
        async with s.post(p.url + "/v1/completions", json=BODY, headers={"Authorization": "Bearer client-key"}) as r:
            assert r.status == 200
    assert "Authorization" not in b.request_headers[-1]
