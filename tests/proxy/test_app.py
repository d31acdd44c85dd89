import asyncio
import json
import time

import aiohttp
import openai
import pytest

from fake_engines.llamacpp.config import LlamaServerConfig
from fake_engines.llamacpp.server import start_llama
from fake_engines.vllm.config import VllmServeConfig
from fake_engines.vllm.server import start_vllm
from policies.routing.base import BackendState, RoutingPolicy
from proxy.config import BackendSpec, HealthConfig
from proxy.engine_metrics import parse_engine_metrics
from tests.proxy.conftest import BackendFactory, ProxyFactory
from tests.waiting import wait_until


def sdk(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


async def test_openai_sdk_gets_complete_answers_streamed_and_not(fake_backend: BackendFactory,
                                                                  proxy_for: ProxyFactory) -> None:
    b = await fake_backend("alpha", chunks=3)
    p = await proxy_for([b])
    client = sdk(p.url)
    chat = await client.chat.completions.create(model="tiny-llama", messages=[{"role": "user", "content": "hi"}])
    assert chat.choices[0].message.content == "alpha-0 alpha-1 alpha-2 "
    comp = await client.completions.create(model="tiny-llama", prompt="hi", max_tokens=3)
    assert comp.choices[0].text == "alpha-0 alpha-1 alpha-2 "
    stream = await client.chat.completions.create(model="tiny-llama", messages=[{"role": "user", "content": "hi"}],
                                                  stream=True, stream_options={"include_usage": True})
    parts, usage = [], None
    async for chunk in stream:
        parts += [c.delta.content for c in chunk.choices if c.delta.content]
        usage = chunk.usage or usage
    assert "".join(parts) == "alpha-0 alpha-1 alpha-2 "
    assert usage is not None and usage.prompt_tokens == 10
    await client.close()


async def test_streams_feed_prefill_accounting_without_showing_clients_a_usage_they_did_not_ask_for(
        fake_backend: BackendFactory, proxy_for: ProxyFactory) -> None:
    b = await fake_backend("u", chunks=2, cached_tokens=4)
    p = await proxy_for([b])
    body = {"model": "tiny-llama", "prompt": "x", "stream": True}
    async with aiohttp.ClientSession() as s:
        async with s.post(p.url + "/v1/completions", json=body) as r:
            plain = await r.read()
        async with s.post(p.url + "/v1/completions", json={**body, "stream_options": {"include_usage": True}}) as r:
            asked = await r.read()
    assert b'"usage"' not in plain and plain.endswith(b"data: [DONE]\n\n")
    assert b'"usage"' in asked
    assert p.proxy.pool.backends[0].prefill_tokens == 2 * (10 - 4)  # both streams counted


async def test_first_streamed_chunk_arrives_before_the_backend_finished(fake_backend: BackendFactory,
                                                                         proxy_for: ProxyFactory) -> None:
    b = await fake_backend("slow", chunks=5, chunk_delay_s=0.2)
    p = await proxy_for([b])
    client = sdk(p.url)
    stream = await client.completions.create(model="tiny-llama", prompt="hi", stream=True)
    first_at = None
    texts = []
    async for chunk in stream:
        first_at = first_at or time.monotonic()
        texts.append(chunk.choices[0].text)
    assert texts == [f"slow-{i} " for i in range(5)]
    # The backend writes its last chunk about 0.8 s after its first; the client had the first
    # one long before that.
    assert first_at < b.finished_at[0] - 0.4
    await client.close()


async def test_every_response_names_its_backend_and_debug_adds_the_rule(fake_backend: BackendFactory,
                                                                         proxy_for: ProxyFactory) -> None:
    b = await fake_backend()
    p = await proxy_for([b])
    body = {"model": "tiny-llama", "prompt": "x"}
    async with aiohttp.ClientSession() as s:
        async with s.post(p.url + "/v1/completions", json=body) as r:
            assert r.status == 200
            assert r.headers["x-flotilla-backend"] == b.url
            assert "x-flotilla-rule" not in r.headers
            assert len(r.headers["X-Request-Id"]) == 32
        async with s.post(p.url + "/v1/completions", json=body,
                          headers={"x-flotilla-debug": "1", "X-Request-Id": "req-42"}) as r:
            assert r.headers["x-flotilla-rule"] == "least-outstanding"
            assert r.headers["X-Request-Id"] == "req-42"
    assert b.request_headers[-1]["X-Request-Id"] == "req-42"
    assert "x-flotilla-debug" not in {k.lower() for k in b.request_headers[-1]}


async def test_models_is_the_union_over_backends_and_adapters_route_where_loaded(
        fake_backend: BackendFactory, proxy_for: ProxyFactory) -> None:
    a = await fake_backend("a")
    b = await fake_backend("b")
    b.adapters = ("sql-lora",)
    p = await proxy_for([a, b])
    async with aiohttp.ClientSession() as s:
        async with s.get(p.url + "/v1/models") as r:
            cards = {c["id"]: c for c in (await r.json())["data"]}
        assert sorted(cards) == ["sql-lora", "tiny-llama"] and cards["sql-lora"]["parent"] == "tiny-llama"
        for _ in range(3):
            async with s.post(p.url + "/v1/completions", json={"model": "sql-lora", "prompt": "x"}) as r:
                assert r.headers["x-flotilla-backend"] == b.url


async def test_a_request_for_a_model_only_one_backend_serves_goes_there(fake_backend: BackendFactory,
                                                                        proxy_for: ProxyFactory) -> None:
    a = await fake_backend("a")
    b = await fake_backend("b")
    b.models = ("other-model",)
    p = await proxy_for([a, b])
    async with aiohttp.ClientSession() as s:
        for _ in range(4):
            async with s.post(p.url + "/v1/completions", json={"model": "other-model", "prompt": "x"}) as r:
                assert r.headers["x-flotilla-backend"] == b.url


async def test_health_ready_and_metrics_endpoints(fake_backend: BackendFactory, proxy_for: ProxyFactory) -> None:
    b = await fake_backend()
    p = await proxy_for([b])
    async with aiohttp.ClientSession() as s:
        async with s.get(p.url + "/health") as r:
            assert r.status == 200
        async with s.get(p.url + "/ready") as r:
            assert (await r.json())["ready_backends"] == 1
        async with s.post(p.url + "/v1/completions", json={"model": "tiny-llama", "prompt": "x"}) as r:
            await r.read()
        async with s.get(p.url + "/metrics") as r:
            text = await r.text()
    assert f'flotilla_requests_total{{backend="{b.url}",model="tiny-llama",status="200"}} 1.0' in text
    assert 'flotilla_routing_decisions_total{policy="least-outstanding",rule="least-outstanding"} 1.0' in text
    assert "vllm:" not in text


async def test_metrics_set_the_policys_predicted_cache_hits_against_what_the_engine_reported(
        fake_backend: BackendFactory, proxy_for: ProxyFactory) -> None:
    b = await fake_backend(cached_tokens=40)  # the engine reports 40 cached prompt tokens every time
    p = await proxy_for([b], policy="prefix-aware")
    body = {"model": "tiny-llama", "prompt": "x" * 640}  # 10 blocks of 64 characters
    async with aiohttp.ClientSession() as s:
        for _ in range(2):  # nothing predicted, then the 10 blocks the first request left there
            async with s.post(p.url + "/v1/completions", json=body) as r:
                await r.read()
        async with s.get(p.url + "/metrics") as r:
            text = await r.text()
    assert f'flotilla_prefix_cache_predicted_tokens_total{{backend="{b.url}"}} 160.0' in text
    assert f'flotilla_prefix_cache_observed_tokens_total{{backend="{b.url}"}} 80.0' in text


async def test_no_ready_backend_answers_503_with_retry_after(fake_backend: BackendFactory,
                                                             proxy_for: ProxyFactory) -> None:
    b = await fake_backend(health_status=503, health_body=b'{"error":{"message":"Loading model"}}')
    p = await proxy_for([b])
    async with aiohttp.ClientSession() as s:
        async with s.post(p.url + "/v1/completions", json={"model": "tiny-llama", "prompt": "x"}) as r:
            assert r.status == 503
            assert r.headers["Retry-After"] == "1"
            assert (await r.json())["error"]["type"] == "unavailable_error"
        async with s.get(p.url + "/ready") as r:
            assert r.status == 503
    assert b.received == 0


async def test_bad_input_gets_openai_errors_with_the_right_status(fake_backend: BackendFactory,
                                                                  proxy_for: ProxyFactory) -> None:
    b = await fake_backend()
    p = await proxy_for([b], max_body_bytes=1000)
    url = p.url + "/v1/chat/completions"
    cases = [
        (dict(data=b"{not json", headers={"Content-Type": "application/json"}), 400),
        (dict(json={"model": "tiny-llama"}), 400),
        (dict(json={"model": "no-such-model", "messages": [{"role": "user", "content": "x"}]}), 404),
        (dict(json={"model": "tiny-llama", "messages": [{"role": "user", "content": "x" * 2000}]}), 413),
        (dict(data=b"hello", headers={"Content-Type": "text/plain"}), 415),
    ]
    async with aiohttp.ClientSession() as s:
        for kwargs, status in cases:
            async with s.post(url, **kwargs) as r:
                assert r.status == status, kwargs
                assert r.headers["x-flotilla-backend"] == ""  # answered by the proxy itself
                err = (await r.json())["error"]
                assert set(err) == {"message", "type", "param", "code"} and "Traceback" not in err["message"]
        async with s.get(p.url + "/nowhere") as r:
            assert r.status == 404 and (await r.json())["error"]["type"] == "not_found_error"
    assert b.received == 0


async def test_sockets_on_both_sides_have_tcp_nodelay(fake_backend: BackendFactory, proxy_for: ProxyFactory) -> None:
    import socket

    b = await fake_backend(chunks=50, chunk_delay_s=0.02)
    p = await proxy_for([b])
    async with aiohttp.ClientSession() as s:
        async with s.post(p.url + "/v1/completions", json={"model": "tiny-llama", "prompt": "x", "stream": True}) as r:
            await r.content.readany()
            server = p.runner.server  # the fast path's connections, or aiohttp's
            client_facing = [f.transport for f in server.fronts] + [c.transport for c in server.connections]
            upstream = [f.attempt.conn.transport for f in server.fronts if f.attempt is not None]
            upstream += [t for t in (c.transport for c in p.proxy.session.connector._acquired) if t]
            socks = [t.get_extra_info("socket") for t in client_facing + upstream]
            assert len(socks) == 2
            assert all(sk.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) for sk in socks)


# The proxy in front of look-alike engines (fake vLLM).

MODEL = "tiny-llama"


@pytest.fixture
async def engines():
    """Starts look-alike engines in this loop: vllm(time_scale, cold_start) and llama(...)."""
    started = []

    async def vllm(time_scale: float = 1.0, cold_start: bool = False):
        config = VllmServeConfig(model="llama-3.1-8b", served_model_name=MODEL, port=0, time_scale=time_scale,
                                 max_model_len=4096)
        running = await start_vllm(config, cold_start=cold_start)
        started.append(running)
        return running

    async def llama(time_scale: float = 1.0, cold_start: bool = False):
        config = LlamaServerConfig(model="llama-3.1-8b-Q4_K_M.gguf", port=0, time_scale=time_scale, metrics=True, n_parallel=2)
        running = await start_llama(config, cold_start=cold_start)
        started.append(running)
        return running

    yield vllm, llama
    for running in started:
        await running.close()


def spec(flavor: str, running) -> BackendSpec:
    return BackendSpec(f"http://127.0.0.1:{running.port}", flavor)


class Url:
    """An engine's base URL, in the shape `proxy_for` takes backends."""

    def __init__(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}"


async def running_requests(url: str) -> float:
    async with aiohttp.ClientSession() as s:
        async with s.get(url + "/metrics") as r:
            return parse_engine_metrics(await r.text()).num_requests_running


async def test_openai_sdk_through_the_proxy_to_two_lookalike_vllm_and_a_llama_server(
        engines, proxy_for: ProxyFactory) -> None:
    vllm, llama = engines
    fleet = [await vllm(0.05), await vllm(0.05), await llama(0.05)]
    for running in fleet:
        await running.wait_ready()
    specs = [spec("vllm", fleet[0]), spec("vllm", fleet[1]), spec("llamacpp", fleet[2])]
    p = await proxy_for(specs, policy="round-robin")
    client = openai.AsyncOpenAI(base_url=p.url + "/v1", api_key="unused", max_retries=0)
    backends = set()
    for _ in range(3):
        raw = await client.completions.with_raw_response.create(model=MODEL, prompt="hello there", max_tokens=8,
                                                                extra_body={"ignore_eos": True})
        backends.add(raw.headers["x-flotilla-backend"])
        comp = raw.parse()
        assert comp.usage.completion_tokens == 8 and comp.choices[0].text
    assert backends == {s.url for s in specs}
    for _ in range(3):
        stream = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=6, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
        pieces, usage = 0, None
        async for chunk in stream:
            pieces += sum(1 for c in chunk.choices if c.delta.content)
            usage = chunk.usage or usage
        assert usage.completion_tokens == 6 and pieces >= 1
    assert all(b.prefill_tokens > 0 for b in p.proxy.pool)  # usage fed each backend's prefill accounting
    await client.close()


async def test_cold_starting_engines_are_starting_then_ready_never_ejected(engines, proxy_for: ProxyFactory) -> None:
    vllm, llama = engines
    # Modelled loads of 18 s and 1.5 s, scaled to about 3 s each: longer than the proxy takes to
    # start and check them on a busy machine (at 0.4 s a load could end first: READY at once).
    v, ll = await vllm(0.15, cold_start=True), await llama(2.0, cold_start=True)
    p = await proxy_for([spec("vllm", v), spec("llamacpp", ll)],
                        health=HealthConfig(interval_s=0.05, timeout_s=0.5))
    pool = p.proxy.pool
    assert [b.state for b in pool] == [BackendState.STARTING, BackendState.STARTING]
    await asyncio.gather(v.wait_ready(), ll.wait_ready())
    await wait_until(lambda: all(b.state is BackendState.READY for b in pool), what="both backends READY")
    assert all(b.breaker.failures == 0 for b in pool)
    assert b"flotilla_backend_ejections_total{" not in p.proxy.metrics.exposition()


async def test_first_chunk_reaches_the_client_before_a_slow_engine_finishes(engines, proxy_for: ProxyFactory) -> None:
    running = await engines[0](1.0)
    await running.wait_ready()
    engine = Url(running.port)
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
        engines, proxy_for: ProxyFactory) -> None:
    running = await engines[0](1.0)
    await running.wait_ready()
    engine = Url(running.port)
    p = await proxy_for([engine])
    body = {"model": MODEL, "prompt": "long answer", "max_tokens": 3000, "ignore_eos": True, "stream": True}
    async with aiohttp.ClientSession() as s:
        resp = await s.post(p.url + "/v1/completions", json=body)
        await resp.content.readany()
        assert await running_requests(engine.url) == 1.0
        resp.close()
    left_at = time.monotonic()
    await wait_until(lambda: _no_running(engine.url), what="vLLM's running gauge back to 0")
    assert time.monotonic() - left_at < 1.0


async def _no_running(url: str) -> bool:
    return await running_requests(url) == 0.0


class BrokenPolicy(RoutingPolicy):
    name = "broken"

    def select(self, backends, request):
        raise RuntimeError("bug in a third-party policy")


async def test_wrong_methods_and_internal_errors_are_json_too(fake_backend: BackendFactory) -> None:
    from proxy.app import start_proxy
    from tests.proxy.conftest import fast_config

    b = await fake_backend()
    p = await start_proxy(fast_config([b]), policy=BrokenPolicy())
    try:
        async with aiohttp.ClientSession() as s:
            async with s.post(p.url + "/health") as r:
                assert r.status == 405 and r.headers["Allow"] == "GET,HEAD"
                assert (await r.json())["error"]["code"] == 405
            async with s.post(p.url + "/v1/completions", json={"model": "tiny-llama", "prompt": "x"}) as r:
                assert r.status == 500
                assert (await r.json())["error"]["message"] == "Internal error in the proxy."
    finally:
        await p.close()


# Anthropic's Messages API through the proxy, to look-alike llama-servers.

LLAMA_MODEL = "llama-3.1-8b-Q4_K_M.gguf"


async def _sse_events(response: aiohttp.ClientResponse) -> list[tuple[str, dict]]:
    """(event name, data) of each event of a stream that names its events."""
    text = (await response.read()).decode()
    events = []
    for block in filter(None, text.split("\n\n")):
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        events.append((lines["event"], json.loads(lines["data"])))
    return events


async def test_anthropic_messages_reach_the_backend_holding_the_prompt_streamed_and_not(
        engines, proxy_for: ProxyFactory) -> None:
    fleet = [await engines[1](0.02), await engines[1](0.02)]
    for running in fleet:
        await running.wait_ready()
    p = await proxy_for([Url(r.port) for r in fleet], policy="prefix-aware")
    system = "You are a careful assistant who answers in one line. " * 20
    body = {"model": LLAMA_MODEL, "max_tokens": 6, "system": [{"type": "text", "text": system}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Say hello"}]}]}
    async with aiohttp.ClientSession() as s:
        async with s.post(p.url + "/v1/messages", json=body) as r:
            assert r.status == 200
            first = r.headers["x-flotilla-backend"]
            message = await r.json()
        assert message["type"] == "message" and message["content"][0]["type"] == "text"
        assert message["usage"]["input_tokens"] > 0 and message["stop_reason"] in ("end_turn", "max_tokens")
        async with s.post(p.url + "/v1/messages", json={**body, "stream": True}) as r:
            assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
            assert r.headers["x-flotilla-backend"] == first  # the shared system prompt is cached there
            events = await _sse_events(r)
        async with s.post(p.url + "/v1/messages/count_tokens", json={k: v for k, v in body.items()
                                                                      if k != "max_tokens"}) as r:
            assert r.status == 200 and r.headers["x-flotilla-backend"] == first
            assert (await r.json())["input_tokens"] == message["usage"]["input_tokens"] + \
                message["usage"]["cache_read_input_tokens"]
    names = [name for name, _ in events]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    assert names[1] == "content_block_start" and names[-3] == "content_block_stop"
    assert all(data["type"] == name for name, data in events)
    assert events[0][1]["message"]["usage"]["cache_read_input_tokens"] > 0  # the first request's prefix
    backend = next(b for b in p.proxy.pool if b.url == first)
    assert backend.prefill_tokens > 0  # usage of both answers fed the prefill accounting


async def test_anthropic_route_errors_come_in_anthropics_envelope(fake_backend: BackendFactory,
                                                                   proxy_for: ProxyFactory) -> None:
    b = await fake_backend()
    p = await proxy_for([b])
    cases = [
        (dict(data=b"{not json", headers={"Content-Type": "application/json"}), 400),
        (dict(json={"model": "tiny-llama", "max_tokens": 5}), 400),
        (dict(json={"model": "tiny-llama", "system": 7, "messages": [{"role": "user", "content": "x"}]}), 400),
        (dict(json={"model": "tiny-llama", "max_tokens": 0, "messages": [{"role": "user", "content": "x"}]}), 400),
        (dict(json={"model": "no-such-model", "messages": [{"role": "user", "content": "x"}]}), 404),
    ]
    async with aiohttp.ClientSession() as s:
        for path in ("/v1/messages", "/v1/messages/count_tokens"):
            for kwargs, status in cases:
                async with s.post(p.url + path, **kwargs) as r:
                    assert r.status == status, (path, kwargs)
                    body = await r.json()
                    assert body["type"] == "error" and set(body["error"]) == {"message", "type", "param", "code"}
        async with s.get(p.url + "/v1/messages") as r:
            assert r.status == 405 and (await r.json())["type"] == "error"
    assert b.received == 0


async def test_anthropic_streams_that_break_end_with_an_error_event_and_failures_keep_the_envelope(
        fake_backend: BackendFactory, proxy_for: ProxyFactory) -> None:
    b = await fake_backend(chunks=5, die_after_chunks=2)
    p = await proxy_for([b])
    body = {"model": "tiny-llama", "max_tokens": 5, "stream": True, "messages": [{"role": "user", "content": "x"}]}
    async with aiohttp.ClientSession() as s:
        async with s.post(p.url + "/v1/messages", json=body) as r:
            assert r.status == 200
            text = (await r.read()).decode()
        assert text.count("data: ") == 3 and "[DONE]" not in text
        name, data = text.rstrip("\n").split("\n\n")[-1].split("\n")
        assert name == "event: error"
        error = json.loads(data[len("data: "):])
        assert error["type"] == "error" and error["error"]["code"] == 502
        b.knobs.die_before_first_byte = True
        async with s.post(p.url + "/v1/messages", json={**body, "stream": False}) as r:
            assert r.status == 502 and r.headers["x-flotilla-backend"] == b.url
            assert (await r.json())["type"] == "error"
