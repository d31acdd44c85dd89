"""Routing, streaming, /v1/models and LoRA through the proxy, over the real wire to real engines."""

from __future__ import annotations

import re

import pytest

from policies.routing.registry import available_policies
from tests.interop.engines import ADAPTERS, MODEL_NAME, Engine
from tests.interop.wire import chat_body, completion_body, event_shape, get_json, post

FLEETS = ("llama", "vllm", "mixed")


@pytest.fixture(params=FLEETS)
def fleet(request: pytest.FixtureRequest) -> list[Engine]:
    """Two llama-servers, two vLLMs, or one of each (the same model name on every engine)."""
    if request.param == "llama":
        return request.getfixturevalue("llama_pair")
    if request.param == "vllm":
        return request.getfixturevalue("vllm_pair")
    return [request.getfixturevalue("llama_pair")[0], request.getfixturevalue("vllm_pair")[0]]


def engine_kind(body: dict) -> str:
    """Which real engine wrote a completion body: llama-server's fingerprint is its build (b1-...),
    vLLM's is vllm-<version>-..."""
    return "vllm" if str(body.get("system_fingerprint", "")).startswith("vllm-") else "llamacpp"


@pytest.mark.parametrize("policy", available_policies())
async def test_every_builtin_policy_routes_real_engines(fleet, policy, proxy_in_front, client):
    running = await proxy_in_front(fleet, policy=policy)
    flavor_of = {e.url: e.flavor for e in fleet}
    used = set()
    for i in range(6):
        prompt = f"Request {i % 3}: the quick brown fox jumps over the lazy dog " * 4
        reply = await post(client, running.url, "/v1/completions", completion_body(prompt),
                           headers={"x-session-id": f"s{i % 2}"})
        assert reply.status == 200, reply.body[:300]
        assert reply.backend in flavor_of, reply.headers
        assert reply.headers.get("x-flotilla-rule"), "the deciding rule is reported"
        body = reply.json()
        assert engine_kind(body) == flavor_of[reply.backend], "the named backend wrote the answer"
        assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"]
        used.add(reply.backend)
    if policy == "round-robin":
        assert used == set(flavor_of), "round-robin used both engines"


async def shapes_direct_and_through(engines: list[Engine], running, client, path: str, body: dict):
    """The stream's event shapes from the engine itself and through the proxy (forced to that engine)."""
    direct = await post(client, engines[0].url, path, body)
    through = await post(client, running.url, path, body)
    assert direct.status == through.status == 200, through.body[:300]
    assert through.events[-1] == direct.events[-1] == "[DONE]"
    return direct, through, [event_shape(c) for c in direct.chunks()], [event_shape(c) for c in through.chunks()]


@pytest.mark.parametrize("flavor", ["llama", "vllm"])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
async def test_stream_with_usage_ends_with_the_engines_usage_event(flavor, path, request, proxy_in_front, client):
    """Asked for usage, the client gets the engine's stream as the engine sends it: usage once, on
    the last event (its own choice-less event, except llama-server's /v1/completions, which puts
    it on the finish event), with completion_tokens = max_tokens."""
    engines = request.getfixturevalue(f"{flavor}_pair")[:1]
    running = await proxy_in_front(engines)
    make = chat_body if "chat" in path else completion_body
    body = make(max_tokens=12, stream=True, ignore_eos=True, stream_options={"include_usage": True})
    direct, through, direct_shapes, shapes = await shapes_direct_and_through(engines, running, client, path, body)
    assert through.headers["content-type"].startswith("text/event-stream")
    assert set(shapes) == set(direct_shapes) and shapes[-1] == direct_shapes[-1]
    chunks = through.chunks()
    usage = chunks[-1]["usage"]
    assert usage["completion_tokens"] == 12, "ignore_eos: exactly max_tokens"
    assert usage["total_tokens"] == usage["prompt_tokens"] + 12
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"
    assert all(not c.get("usage") for c in chunks[:-1]), "usage comes once, at the end"


@pytest.mark.parametrize("flavor", ["llama", "vllm"])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
async def test_stream_without_usage_has_no_usage_event(flavor, path, request, proxy_in_front, client):
    """The proxy asks the engine for usage (it counts prefill tokens) and takes that event out
    again for a client that did not ask: the client sees the event shapes the engine itself sends
    unasked (llama-server's /v1/completions carries usage on its finish event even then)."""
    engines = request.getfixturevalue(f"{flavor}_pair")[:1]
    running = await proxy_in_front(engines)
    make = chat_body if "chat" in path else completion_body
    body = make(max_tokens=12, stream=True, ignore_eos=True)
    direct, through, direct_shapes, shapes = await shapes_direct_and_through(engines, running, client, path, body)
    # Known difference: asked for usage, the engines put system_fingerprint (vLLM) or timings
    # (llama-server chat) on the usage event instead of the finish event, and the proxy removes
    # that event whole, so a client that did not ask for usage does not get them.
    shapes, direct_shapes = ([re.sub(r",(system_fingerprint|timings)\b", "", x) for x in xs]
                             for xs in (shapes, direct_shapes))
    assert set(shapes) == set(direct_shapes) and shapes[-1] == direct_shapes[-1], (direct_shapes, shapes)
    assert all(c["choices"] for c in through.chunks()), "no choice-less usage event"
    assert through.chunks()[-1]["choices"][0]["finish_reason"] == "length"
    assert running.proxy.pool.find(through.backend).prefill_tokens > 0, "the proxy still counted the prefill"


async def test_models_is_the_union_of_real_engines_models_and_adapters(llama_pair, vllm_pair, proxy_in_front,
                                                                       client):
    running = await proxy_in_front([*llama_pair, *vllm_pair])
    status, body = await get_json(client, running.url + "/v1/models")
    assert status == 200
    ids = [m["id"] for m in body["data"]]
    assert sorted(ids) == sorted({MODEL_NAME, *ADAPTERS}), ids
    assert body["object"] == "list"


@pytest.mark.parametrize("adapter", ADAPTERS)
async def test_lora_requests_go_only_to_the_vllm_that_serves_the_adapter(adapter, vllm_pair, proxy_in_front,
                                                                         client):
    """vllm-0 serves lora-a, vllm-1 lora-b: every request for an adapter lands on its engine, which
    answers as the adapter; the base model still goes to both."""
    home = vllm_pair[ADAPTERS.index(adapter)]
    running = await proxy_in_front(vllm_pair, policy="lora-affinity")
    for i in range(4):
        reply = await post(client, running.url, "/v1/completions", {**completion_body(f"lora {i}"), "model": adapter})
        assert reply.status == 200, reply.body[:300]
        assert reply.backend == home.url
        assert reply.json()["model"] == adapter
        stream = await post(client, running.url, "/v1/chat/completions",
                            {**chat_body(f"lora {i}", stream=True), "model": adapter})
        assert stream.backend == home.url and stream.chunks()[0]["model"] == adapter
    rr = await proxy_in_front(vllm_pair, policy="round-robin")
    used = {(await post(client, rr.url, "/v1/completions", completion_body(f"base {i}"))).backend for i in range(4)}
    assert used == {e.url for e in vllm_pair}


async def test_unknown_model_is_the_proxys_404_not_an_engine_error(vllm_pair, proxy_in_front, client):
    running = await proxy_in_front(vllm_pair)
    reply = await post(client, running.url, "/v1/completions", {**completion_body(), "model": "no-such-model"})
    assert reply.status == 404
    error = reply.json()["error"]
    assert set(error) >= {"message", "type", "param", "code"} and error["param"] == "model"
    assert reply.backend == ""
