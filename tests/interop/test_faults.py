"""Startup, crashes, the breaker, client disconnects and admission, with real engines."""

from __future__ import annotations

import asyncio
import threading

import aiohttp
import pytest

from policies.routing.base import BackendState
from proxy.limits import LimitsConfig
from tests.interop.engines import VLLM_STARTUP_S, Engine, InteropCache, health_status, vllm_engine
from tests.interop.wire import chat_body, completion_body, post, scrape, total
from tests.waiting import wait_until

LONG = 3000
"""Tokens of a long request (ignore_eos): seconds of decoding."""
ENGINE_WAIT_S = 120.0


class HealthWatch:
    """Polls an engine's /health from a thread every 10 ms and keeps each change of answer."""

    def __init__(self, port: int) -> None:
        self.port, self.seen, self._stop = port, [], threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            status = health_status(self.port, timeout_s=1.0)
            if not self.seen or self.seen[-1] != status:
                self.seen.append(status)
            self._stop.wait(0.01)

    def __enter__(self) -> HealthWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


async def serve_while_loading(loading: Engine, ready: Engine, proxy_in_front, client) -> dict:
    """Start `loading` behind a proxy that also has `ready`; send requests until the loading one
    answers /health 200. What the proxy and the engine did meanwhile."""
    running = await proxy_in_front([ready, loading], ready=False)
    await wait_until(lambda: running.proxy.pool.find(ready.url).state is BackendState.READY,
                     what="the ready engine ready")
    backend = running.proxy.pool.find(loading.url)
    states, replies = set(), []
    with HealthWatch(loading.port) as watch:
        loading.start()
        deadline = asyncio.get_running_loop().time() + VLLM_STARTUP_S
        while health_status(loading.port) != 200:
            assert loading.alive(), loading.log_tail()
            assert asyncio.get_running_loop().time() < deadline, f"not up in time:\n{loading.log_tail()}"
            states.add(backend.state)
            reply = await post(client, running.url, "/v1/completions", completion_body(max_tokens=2))
            replies.append((reply.status, reply.backend))
            await asyncio.sleep(0.05)  # pacing of the client's load, not a wait for a condition
        await wait_until(lambda: backend.state is BackendState.READY, 30, what="the loaded engine ready")
    used = {(await post(client, running.url, "/v1/completions", completion_body(f"{i}", max_tokens=2))).backend
            for i in range(4)}
    return {"states": states, "replies": replies, "seen": watch.seen, "used": used,
            "failures": backend.breaker.failures}


async def test_a_loading_llama_server_is_starting_never_ejected_and_joins_once_ready(
        interop_cache: InteropCache, llama_pair, own_llamas, proxy_in_front, client):
    """llama-server binds first and answers 503 "Loading model" while it loads (a 70M model: long
    enough to see): the proxy keeps it `starting`, routes every request to the ready engine, never
    counts a failure, and routes to it once it is up."""
    loading = own_llamas("llama-loading", model=interop_cache.slow_gguf)
    seen = await serve_while_loading(loading, llama_pair[0], proxy_in_front, client)
    assert seen["states"] == {BackendState.STARTING}, seen
    assert all(r == (200, llama_pair[0].url) for r in seen["replies"]), seen["replies"]
    assert seen["failures"] == 0 and loading.url in seen["used"]
    assert 503 in seen["seen"], f"the 503 loading phase was seen: {seen['seen']}"


async def test_a_loading_vllm_refuses_connections_and_stays_starting_until_it_serves(
        interop_cache: InteropCache, vllm_pair, engine_logs, proxy_in_front, client):
    """vLLM refuses connections for the whole load (tens of seconds), then answers 200: never 503.
    Behind the proxy it stays `starting` throughout, no request fails, no failure is counted."""
    loading = vllm_engine(interop_cache, "vllm-loading", engine_logs)
    try:
        seen = await serve_while_loading(loading, vllm_pair[0], proxy_in_front, client)
    finally:
        loading.stop()
    assert seen["seen"][0] == "refused" and 503 not in seen["seen"], seen["seen"]
    assert seen["states"] == {BackendState.STARTING}, seen
    assert all(r == (200, vllm_pair[0].url) for r in seen["replies"]), seen["replies"]
    assert seen["failures"] == 0 and loading.url in seen["used"]


async def test_killing_an_engine_mid_request_is_retried_on_the_other_before_the_first_byte(
        interop_cache: InteropCache, own_llamas, proxy_in_front, client):
    """A non-streamed request's first byte is its whole answer: SIGKILL the engine working on it
    (a slow model, so it is still decoding), and the proxy retries it on the other engine; the
    client sees one 200."""
    victim = own_llamas("llama-victim", model=interop_cache.slow_gguf)
    survivor = own_llamas("llama-survivor")
    for e in (victim, survivor):
        e.start().wait_ready()
    running = await proxy_in_front([victim, survivor], policy="round-robin")
    task = asyncio.create_task(post(client, running.url, "/v1/completions",
                                    completion_body("a long one", max_tokens=LONG, ignore_eos=True)))
    await wait_until(lambda: running.proxy.pool.find(victim.url).in_flight == 1, what="the request at the victim")
    await wait_until(lambda: busy(client, victim), ENGINE_WAIT_S, what="the victim decoding")
    victim.kill()
    reply = await task
    assert reply.status == 200 and reply.backend == survivor.url, (reply.status, reply.body[:200])
    assert reply.json()["usage"]["completion_tokens"] == LONG
    metrics = await scrape(client, running.url)
    assert total(metrics, "flotilla_retries_total") >= 1


async def busy(client: aiohttp.ClientSession, engine: Engine) -> bool:
    return total(await scrape(client, engine.url), "llamacpp:requests_processing") >= 1


async def test_a_dead_engine_is_ejected_and_rejoins_after_it_comes_back(own_llamas, proxy_in_front, client):
    """Kill one of two engines: requests keep succeeding (retried), the breaker ejects it; restart
    it on the same port: a half-open probe brings it back and it serves again."""
    flaky, steady = own_llamas("llama-flaky"), own_llamas("llama-steady")
    for e in (flaky, steady):
        e.start().wait_ready()
    running = await proxy_in_front([flaky, steady], policy="round-robin")
    backend = running.proxy.pool.find(flaky.url)
    flaky.kill()
    replies = []
    while backend.state is not BackendState.EJECTED:
        replies.append(await post(client, running.url, "/v1/completions", completion_body(max_tokens=2)))
        assert len(replies) < 200, "never ejected"
    assert all(r.status == 200 and r.backend == steady.url for r in replies)
    metrics = await scrape(client, running.url)
    assert total(metrics, "flotilla_backend_ejections_total", backend=flaky.url) == 1
    flaky.start().wait_ready()
    await wait_until(lambda: backend.state is BackendState.READY, ENGINE_WAIT_S, what="the restarted engine back")
    used = {(await post(client, running.url, "/v1/completions", completion_body(max_tokens=2))).backend
            for _ in range(4)}
    assert used == {flaky.url, steady.url}


@pytest.mark.parametrize("flavor, running_gauge, done_counter", [
    ("vllm", "vllm:num_requests_running", "vllm:generation_tokens_total"),
    ("llama", "llamacpp:requests_processing", "llamacpp:n_decode_total"),
])
async def test_a_client_disconnect_aborts_the_real_engines_request(flavor, running_gauge, done_counter, request,
                                                                    interop_cache, own_llamas, proxy_in_front,
                                                                    client):
    """A client reads a few events of a long stream and hangs up: the engine's own running gauge
    returns to 0 while its token counter stays far below what the request asked for (aborted,
    not finished); the proxy counts the disconnect and blames no backend."""
    if flavor == "llama":
        engine = own_llamas("llama-slow", model=interop_cache.slow_gguf)
        engine.start().wait_ready()
    else:
        engine = request.getfixturevalue("vllm_pair")[1]
    running = await proxy_in_front([engine])
    start = await scrape(client, engine.url)
    before, successes = total(start, done_counter), total(start, "vllm:request_success_total")
    body = chat_body("tell a long story", max_tokens=LONG, stream=True, ignore_eos=True)
    async with client.post(running.url + "/v1/chat/completions", json=body) as resp:
        assert resp.status == 200
        events = 0
        async for line in resp.content:
            events += line.startswith(b"data: ")
            if events == 5:
                break
        await wait_until(lambda: gauge(client, engine, running_gauge, 1), ENGINE_WAIT_S,
                         what=f"{running_gauge} 1 at the engine")
    # leaving the block closed the connection
    await wait_until(lambda: gauge(client, engine, running_gauge, 0), ENGINE_WAIT_S,
                     what=f"{running_gauge} back to 0")
    after = await scrape(client, engine.url)
    assert total(after, done_counter) - before < LONG / 2, "the engine stopped long before max_tokens"
    if flavor == "vllm":  # an aborted request is no success of any finished_reason
        assert total(after, "vllm:request_success_total") == successes
    await wait_until(lambda: counted(client, running.url, "flotilla_client_disconnects_total"),
                     what="the proxy counted the disconnect")
    assert running.proxy.pool.find(engine.url).breaker.failures == 0


async def counted(client: aiohttp.ClientSession, url: str, name: str) -> float:
    return total(await scrape(client, url), name)


async def gauge(client: aiohttp.ClientSession, engine: Engine, name: str, value: float) -> bool:
    return total(await scrape(client, engine.url), name) == value


async def test_admission_answers_429_past_the_queue(interop_cache: InteropCache, own_llamas, proxy_in_front,
                                                    client):
    """One slot and one queue place per model in front of a real engine (a slow model, so the
    requests holding them stay): the third request gets 429 with Retry-After at once, in the
    OpenAI error shape."""
    engine = own_llamas("llama-admission", model=interop_cache.slow_gguf)
    engine.start().wait_ready()
    limits = LimitsConfig(max_in_flight_per_model=1, max_queued_per_model=1)
    running = await proxy_in_front([engine], limits=limits)
    body = completion_body("hold the slot", max_tokens=LONG, ignore_eos=True)
    holders = [asyncio.create_task(post(client, running.url, "/v1/completions", body))]
    try:
        await wait_until(lambda: sum(b.in_flight for b in running.proxy.pool) == 1, what="one forwarded")
        holders.append(asyncio.create_task(post(client, running.url, "/v1/completions", body)))
        await wait_until(lambda: running.proxy.admission.queued() == 1, what="one queued")
        refused = await post(client, running.url, "/v1/completions", completion_body(max_tokens=2))
        assert refused.status == 429, refused.body[:200]
        assert int(refused.headers["retry-after"]) >= 1
        error = refused.json()["error"]
        assert error["code"] == "queue_full" and set(error) >= {"message", "type", "param", "code"}
    finally:
        for task in holders:
            task.cancel()
        await asyncio.gather(*holders, return_exceptions=True)


async def test_no_ready_engine_is_503_with_retry_after(own_llamas, proxy_in_front, client):
    gone = own_llamas("llama-never-started")
    running = await proxy_in_front([gone], ready=False)
    reply = await post(client, running.url, "/v1/chat/completions", chat_body(max_tokens=2))
    assert reply.status == 503 and int(reply.headers["retry-after"]) >= 1
    assert set(reply.json()["error"]) >= {"message", "type", "param", "code"}
