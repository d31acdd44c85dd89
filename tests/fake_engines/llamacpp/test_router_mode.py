"""fake-llama-server without -m, llama-server's router, over real sockets: the model list from the
cache, --models-dir and a preset; load, unload, autoload, --models-max eviction; errors; proxying;
resumable streams through the router."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from fake_engines.llamacpp.config import LlamaServerConfig
from fake_engines.llamacpp.model_sources import cache_name, record_download
from fake_engines.llamacpp.router_mode import RouterSettings, child_flags, start_router
from tests.waiting import wait_until

CHILD = ["--time-scale", "0.01", "-c", "512", "-np", "1"]
GEMMA, STORIES = "ggml-org/tinygemma3-GGUF:Q8_0", "ggml-org/test-model-stories260K:F32"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LLAMA_CACHE", str(tmp_path / "cache"))
    for name in (GEMMA, STORIES):
        record_download(name, name.split(":")[0])
    return tmp_path


async def _router(tmp_path, child_argv: list[str] = CHILD, **settings) -> object:
    config = LlamaServerConfig(model="llama-3.2-1b-Q8_0.gguf", port=0, time_scale=0.01)
    return await start_router(config, RouterSettings(child_argv=child_argv, **settings))


async def _statuses(http: aiohttp.ClientSession, base: str) -> dict[str, str]:
    async with http.get(base + "/models") as resp:
        return {m["id"]: m["status"]["value"] for m in (await resp.json())["data"]}


def test_router_only_flags_stay_with_the_router():
    argv = ["--port", "8080", "--models-max=2", "-c", "1024", "--no-models-autoload", "--api-key", "k", "--temp", "0"]
    assert child_flags(argv) == ["-c", "1024", "--temp", "0"]
    assert cache_name("ggml-org/x-GGUF:q8_0", None) == "ggml-org/x-GGUF:Q8_0"
    assert cache_name("ggml-org/models", "bert/ggml-model-f16.gguf") == "ggml-org/models:F16"


async def test_router_lists_loads_proxies_evicts_and_unloads(cache):
    models_dir = cache / "models"
    models_dir.mkdir()
    (models_dir / "local-model.gguf").write_bytes(b"")
    preset = cache / "presets.ini"
    preset.write_text("[*]\nparallel = 3\nno-slots = false\n\n[my-preset]\nhf-repo = ggml-org/test-model-stories260K\n"
                      "alias = mine,also-mine\nctx-size = 300\nmetrics = true\n")
    running = await _router(cache, models_dir=str(models_dir), models_preset=str(preset), models_max=1)
    base = f"http://127.0.0.1:{running.port}"
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(base + "/props") as resp:
                props = await resp.json()
            assert props["role"] == "router" and props["max_instances"] == 1 and props["models_autoload"] is True
            async with http.get(base + "/v1/models") as resp:
                cards = {m["id"]: m for m in (await resp.json())["data"]}
            assert set(cards) == {GEMMA, STORIES, "local-model", "my-preset"}
            assert [cards[GEMMA]["source"], cards["local-model"]["source"], cards["my-preset"]["source"]] == \
                ["cache", "models_dir", "preset"]
            assert cards[GEMMA]["can_remove"] and not cards["my-preset"]["can_remove"]
            assert cards["my-preset"]["aliases"] == ["mine", "also-mine"]
            assert "ctx-size = 300" in cards["my-preset"]["status"]["preset"]
            assert all(c["status"]["value"] == "unloaded" for c in cards.values())

            async with http.post(base + "/models/load", json={"model": GEMMA}) as resp:
                assert resp.status == 200 and await resp.json() == {"success": True}
            async with http.post(base + "/models/load", json={"model": GEMMA}) as resp:
                assert resp.status == 400 and (await resp.json())["error"]["message"] == "model is already running"
            await wait_until(lambda: _is(http, base, GEMMA, "loaded"), what="gemma loaded")

            body = {"model": "mine", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
            async with http.post(base + "/v1/chat/completions", json=body) as resp:  # autoload, by alias
                assert resp.status == 200
                answer = await resp.json()
            assert answer["model"] == "my-preset" and answer["usage"]["completion_tokens"] == 3
            async with http.get(base + "/models") as resp:
                cards = {m["id"]: m for m in (await resp.json())["data"]}
            assert cards["my-preset"]["status"]["value"] == "loaded"
            assert cards[GEMMA]["status"]["value"] == "unloaded"  # --models-max 1: the least recently used went
            # the instance's own card; the router's flags (-c 512 -np 1) win over the preset's
            assert cards["my-preset"]["meta"]["n_ctx"] == 512 and "meta" not in cards[GEMMA]

            async with http.post(base + "/v1/chat/completions", json={**body, "model": "nope"}) as resp:
                assert resp.status == 400
                assert (await resp.json())["error"]["message"] == "model 'nope' not found"
            async with http.post(base + "/v1/chat/completions", json={"messages": []}) as resp:
                assert (await resp.json())["error"]["message"] == "model name is missing from the request"
            async with http.get(base + "/slots?model=my-preset") as resp:  # GET routes name the model in the query
                assert resp.status == 200 and len(await resp.json()) == 1
            async with http.get(base + "/metrics?model=my-preset") as resp:  # `metrics = true` of the preset
                assert resp.status == 200

            async with http.post(base + "/models/unload", json={"model": "my-preset"}) as resp:
                assert resp.status == 200
            await wait_until(lambda: _is(http, base, "my-preset", "unloaded"), what="preset unloaded")
            async with http.post(base + "/models/unload", json={"model": "my-preset"}) as resp:
                assert resp.status == 400 and (await resp.json())["error"]["message"] == "model is not running"
            async with http.post(base + "/models/load", json={"model": "nope"}) as resp:
                assert resp.status == 404 and (await resp.json())["error"]["type"] == "not_found_error"
    finally:
        await running.drain_and_close()


async def _sse_events(resp: aiohttp.ClientResponse, count: int) -> list[dict]:
    events = []
    while len(events) < count:
        line = await resp.content.readline()
        if line.startswith(b"data: "):
            events.append(json.loads(line[6:]))
    return events


async def _is(http: aiohttp.ClientSession, base: str, model: str, status: str) -> bool:
    return (await _statuses(http, base))[model] == status


async def test_without_autoload_a_request_for_an_unloaded_model_is_refused_and_an_idle_one_sleeps(cache):
    running = await _router(cache, autoload=False, child_argv=[*CHILD, "--sleep-idle-seconds", "1"])
    base = f"http://127.0.0.1:{running.port}"
    try:
        async with aiohttp.ClientSession() as http:
            body = {"model": STORIES, "prompt": "hello", "n_predict": 2}
            async with http.post(base + "/completion", json=body) as resp:
                assert resp.status == 400 and (await resp.json())["error"]["message"] == "model is not loaded"
            events = await http.get(base + "/models/sse")
            async with http.post(base + "/completion?autoload=true", json=body) as resp:  # the query overrides
                assert resp.status == 200
            seen = await asyncio.wait_for(_sse_events(events, 2), 30)
            assert [(e["model"], e["event"], e["data"]["status"]) for e in seen] == \
                [(STORIES, "model_status", "loading"), (STORIES, "model_status", "loaded")]
            events.close()
            await wait_until(lambda: _is(http, base, STORIES, "sleeping"), what="the idle instance asleep")
            async with http.post(base + "/completion", json=body) as resp:  # a sleeping model is still loaded
                assert resp.status == 200
            assert (await _statuses(http, base))[STORIES] == "loaded"
    finally:
        await running.drain_and_close()


async def test_stream_session_is_replayed_and_stopped_through_the_router(cache):
    running = await _router(cache)
    base = f"http://127.0.0.1:{running.port}"
    conv = f"conv-1::{GEMMA}"
    try:
        async with aiohttp.ClientSession() as http:
            body = {"model": GEMMA, "stream": True, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
            async with http.post(base + "/chat/completions", json=body, headers={"X-Conversation-Id": conv}) as resp:
                streamed = await resp.read()
            assert resp.status == 200 and streamed.endswith(b"data: [DONE]\n\n")
            async with http.get(base + "/v1/stream", params={"conv_id": conv, "from": "0"}) as resp:
                assert resp.status == 200 and await resp.read() == streamed
            async with http.post(base + "/v1/streams/lookup", json={"conversation_ids": [conv, "other"]}) as resp:
                rows = await resp.json()
            assert [(r["conversation_id"], r["is_done"], r["total_bytes"]) for r in rows] == \
                [(conv, True, len(streamed))]
            async with http.delete(base + "/v1/stream", params={"conv_id": conv}) as resp:
                assert resp.status == 204
            async with http.get(base + "/v1/stream", params={"conv_id": conv}) as resp:
                assert resp.status == 404
                assert (await resp.json())["error"]["message"] == "Stream not found or expired"
            async with http.get(base + "/v1/stream") as resp:
                assert resp.status == 400
                assert (await resp.json())["error"]["message"] == "Missing conversation id in path"
    finally:
        await running.drain_and_close()


async def test_queued_request_waits_for_the_busy_model_instead_of_evicting_it(cache):
    running = await _router(cache, models_max=1)
    base = f"http://127.0.0.1:{running.port}"
    try:
        async with aiohttp.ClientSession() as http:
            long = {"model": GEMMA, "prompt": "hello", "n_predict": 40, "ignore_eos": True}
            busy = asyncio.create_task(http.post(base + "/completion", json=long))
            await wait_until(lambda: _is(http, base, GEMMA, "loaded"), what="gemma loaded")
            queued = asyncio.create_task(http.post(base + "/tokenize", json={"model": STORIES, "content": "hi"}))
            first = await busy
            assert first.status == 200 and (await first.json())["tokens_predicted"] == 40  # not cut short
            second = await queued
            assert second.status == 200 and (await second.json())["tokens"]
            statuses = await _statuses(http, base)
            assert statuses == {GEMMA: "unloaded", STORIES: "loaded"}
    finally:
        await running.drain_and_close()
