"""The fake llama-server over real sockets: openai SDK, captured shapes and errors, slots, deferral,
prompt reuse, LoRA turn-taking, disconnects and the loading phase."""

from __future__ import annotations

import asyncio
import http.client
import json
import urllib.error
import urllib.request

import aiohttp
import openai
import pytest

from fake_engines.llamacpp.config import LlamaServerConfig
from fake_engines.llamacpp.server import start_llama
from tests.conftest import DATA
from tests.fake_engines.client import post_json
from tests.fake_engines.engine_thread import EngineThread
from tests.fake_engines.scrape import fetch_text, value
from tests.waiting import wait_until

CAPTURES = DATA / "real-engines" / "llama.cpp"
MODEL = "llama-3.1-8b-Q4_K_M.gguf"


def _config(**overrides) -> LlamaServerConfig:
    base = {"model": MODEL, "port": 0, "time_scale": 0.01, "metrics": True, "n_parallel": 2, "n_ctx": 2048}
    return LlamaServerConfig(**{**base, **overrides})


@pytest.fixture(scope="module")
def engine():
    with EngineThread(lambda: start_llama(_config(), cold_start=False)) as running:
        yield running


def test_openai_sdk_sync_and_async_against_llama_server(engine):
    client = openai.OpenAI(base_url=engine.base_url + "/v1", api_key="x")
    completion = client.completions.create(model="ignored", prompt="Hello world, the quick brown fox", max_tokens=8,
                                           extra_body={"ignore_eos": True})
    assert completion.model == MODEL and completion.usage.completion_tokens == 8
    chat = client.chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert chat.choices[0].message.content and chat.object == "chat.completion"
    chunks = list(client.chat.completions.create(model="x", messages=[{"role": "user", "content": "hello"}],
                                                 max_tokens=5, stream=True, extra_body={"ignore_eos": True}))
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].choices[0].delta.content is None
    assert chunks[-1].choices[0].finish_reason == "length" and chunks[-1].choices[0].delta.content is None
    assert chunks[-1].model_extra["timings"]["predicted_n"] == 5
    assert asyncio.run(_async_stream(engine.base_url)) == 6


async def _async_stream(base: str) -> int:
    client = openai.AsyncOpenAI(base_url=base + "/v1", api_key="x")
    stream = await client.completions.create(model="x", prompt="abcd" * 10, max_tokens=6, stream=True,
                                             extra_body={"ignore_eos": True})
    chunks = [c async for c in stream]
    await client.close()
    last = chunks[-1]
    assert last.choices[0].finish_reason == "length" and last.choices[0].text == ""
    assert "timings" in last.model_extra
    return last.usage.completion_tokens


@pytest.mark.parametrize("name", ["047_err_missing_messages_chat", "048_err_missing_prompt_completions",
                                  "054_err_max_tokens_negative_chat", "056_err_temperature_wrong_type_completions",
                                  "059_err_messages_not_a_list", "060_err_stream_wrong_type", "061_err_empty_body",
                                  "045_err_malformed_json_completions", "046_err_malformed_json_chat"])
def test_error_bodies_match_the_capture(engine, name):
    raw = (CAPTURES / f"{name}.req.json").read_text()
    expected = _captured_body(name)
    path = "/v1/chat/completions" if "messages" in raw or "chat" in name else "/v1/completions"
    assert post_json(engine.base_url, path, raw.encode()) == (expected["error"]["code"], expected)


def test_prompt_longer_than_a_slot_is_exceed_context_size_error(engine):
    status, body = post_json(engine.base_url, "/v1/completions", json.dumps({"prompt": "abcd" * 3001}).encode())
    assert status == 400  # 3001 text tokens and the BOS llama-server adds before a text prompt
    assert body == {"error": {"code": 400, "message": "request (3002 tokens) exceeds the available context size "
                              "(1024 tokens), try increasing it", "type": "exceed_context_size_error",
                              "n_prompt_tokens": 3002, "n_ctx": 1024}}
    # the slot's whole context is refused too (n_tokens >= slot.n_ctx), on every route, streamed or not
    for path, body in [("/completion", {"prompt": "abcd" * 1023}), ("/completion", {"prompt": "abcd" * 1023, "stream": True}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "abcd" * 1100}], "stream": True})]:
        status, refused = post_json(engine.base_url, path, json.dumps(body).encode())
        assert status == 400 and refused["error"]["type"] == "exceed_context_size_error", path
        assert "exceeds the available context size (1024 tokens)" in refused["error"]["message"]


def test_unknown_route_and_idle_slots_look_like_the_capture(engine):
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(engine.base_url + "/version", timeout=10)
    assert err.value.code == 404 and json.loads(err.value.read())["error"]["message"] == "File Not Found"
    models = json.loads(fetch_text(engine.base_url, "/v1/models"))
    assert models["data"][0]["id"] == MODEL and models["data"][0]["meta"]["n_ctx"] == 1024
    props = json.loads(fetch_text(engine.base_url, "/props"))
    assert props["total_slots"] == 2 and props["build_info"] == "b1-0c1e570"


def test_identical_prompt_reuses_the_slot_cache_except_one_token(engine):
    body = json.dumps({"prompt": "0123456789abcdef" * 40, "max_tokens": 2}).encode()
    before = fetch_text(engine.base_url)
    _, first = post_json(engine.base_url, "/v1/completions", body)
    _, second = post_json(engine.base_url, "/v1/completions", body)
    after = fetch_text(engine.base_url)
    # BOS and 160 text tokens, all but the last reused
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == 160
    assert second["timings"]["cache_n"] == 160 and second["timings"]["prompt_n"] == 1
    assert value(after, "llamacpp:prompt_tokens_cached_total") - value(before, "llamacpp:prompt_tokens_cached_total") \
        >= 160


async def _complete(session, base, body):
    async with session.post(base + "/v1/completions", json=body) as resp:
        assert resp.status == 200
        return await resp.json()


async def _served(config: LlamaServerConfig):
    running = await start_llama(config, cold_start=False)
    await running.wait_ready()
    return running, f"http://127.0.0.1:{running.port}"


async def test_two_slots_and_five_requests_defer_three():
    running, base = await _served(_config(time_scale=0.5))
    try:
        async with aiohttp.ClientSession() as session:
            body = {"prompt": "hello there", "max_tokens": 200, "ignore_eos": True}
            tasks = [asyncio.create_task(_complete(session, base, body)) for _ in range(5)]
            seen = set()
            while not all(t.done() for t in tasks):
                async with session.get(base + "/metrics") as resp:
                    text = await resp.text()
                seen.add((value(text, "llamacpp:requests_processing"), value(text, "llamacpp:requests_deferred")))
                await asyncio.sleep(0.01)  # sampling interval while the requests run, not a wait
            await asyncio.gather(*tasks)
    finally:
        await running.close()
    assert (2, 3) in seen and all(p <= 2 for p, _ in seen)


async def test_mixed_lora_requests_take_turns_and_same_lora_requests_share_steps(tmp_path):
    # modelled time at wall speed: a step lasts milliseconds, so the two requests of a wave start
    # within a step or two of each other even on a busy machine
    config = _config(time_scale=1.0, loras=[(str(tmp_path / "a.gguf"), 0.0), (str(tmp_path / "b.gguf"), 0.0)])
    running, base = await _served(config)
    try:
        async with aiohttp.ClientSession() as session:
            decodes = []
            for adapters in ((0, 0), (0, 1)):
                async with session.get(base + "/metrics") as resp:
                    before = value(await resp.text(), "llamacpp:n_decode_total")
                bodies = [{"prompt": "hi", "max_tokens": 40, "ignore_eos": True, "lora": [{"id": a, "scale": 1.0}]}
                          for a in adapters]
                await asyncio.gather(*[_complete(session, base, b) for b in bodies])
                async with session.get(base + "/metrics") as resp:
                    decodes.append(value(await resp.text(), "llamacpp:n_decode_total") - before)
    finally:
        await running.close()
    # same adapter: both requests ride the same steps (41 when they start together; a late start
    # on a loaded machine adds a few), far below the 79 that taking turns needs
    assert decodes[0] <= 60
    assert decodes[1] >= 79  # different adapters never share a step: twice the steps


async def test_disconnect_cancels_the_task_and_frees_the_slot():
    running, base = await _served(_config(time_scale=1.0))
    try:
        async with aiohttp.ClientSession() as session:
            body = {"prompt": "hello", "max_tokens": 2000, "ignore_eos": True, "stream": True}
            resp = await session.post(base + "/v1/completions", json=body)
            events = 0
            async for line in resp.content:
                events += line.startswith(b"data: ")
                if events == 20:
                    break
            resp.close()

            async def idle() -> str | None:
                async with session.get(base + "/metrics") as r:
                    text = await r.text()
                return text if value(text, "llamacpp:requests_processing") == 0 else None

            # the request would run 2,000 tokens; fewer predicted (below) proves the slot was freed early
            text = await wait_until(idle, what="the slot freed after the client left")
            async with session.get(base + "/slots") as r:
                slots = await r.json()
    finally:
        await running.close()
    assert 20 <= value(text, "llamacpp:tokens_predicted_total") < 2000
    assert not any(s["is_processing"] for s in slots)


async def test_every_route_answers_503_loading_model_until_loaded():
    running = await start_llama(_config(time_scale=0.2, startup_s=1.0))
    try:
        async with aiohttp.ClientSession() as session:
            for path in ("/health", "/v1/models"):
                async with session.get(f"http://127.0.0.1:{running.port}{path}") as resp:
                    assert resp.status == 503
                    assert await resp.json() == {"error": {"message": "Loading model", "type": "unavailable_error",
                                                           "code": 503}}
            await running.wait_ready()
            async with session.get(f"http://127.0.0.1:{running.port}/health") as resp:
                assert (resp.status, await resp.json()) == (200, {"status": "ok"})
    finally:
        await running.close()


async def test_metrics_and_slots_answer_501_when_disabled():
    running, base = await _served(_config(metrics=False, slots=False))
    try:
        async with aiohttp.ClientSession() as session:
            for path in ("/metrics", "/slots"):
                async with session.get(base + path) as resp:
                    assert resp.status == 501 and (await resp.json())["error"]["type"] == "not_supported_error"
    finally:
        await running.close()


async def test_busy_slots_show_the_captured_fields_and_the_task_progress():
    running, base = await _served(_config(time_scale=0.5))
    capture = json.loads((CAPTURES / "slow-model" / "022_concurrency_stream_slots_during_load.http").read_text()
                         .split("\n\n", 1)[1])
    try:
        async with aiohttp.ClientSession() as session:
            body = {"prompt": "hello there", "max_tokens": 100, "ignore_eos": True}
            tasks = [asyncio.create_task(_complete(session, base, body)) for _ in range(2)]
            slots = []
            while not all(s.get("is_processing") for s in slots) or len(slots) < 2:
                async with session.get(base + "/slots") as resp:
                    slots = await resp.json()
            await asyncio.gather(*tasks)
    finally:
        await running.close()
    assert [set(s) for s in slots] == [set(s) for s in capture]
    assert all(s["next_token"][0]["n_decoded"] + s["next_token"][0]["n_remain"] == 100 for s in slots)
    assert all(s["n_prompt_tokens"] == 4 for s in slots)  # BOS and "hello there" in 3


async def test_api_key_and_lora_adapter_scales(tmp_path):
    config = _config(api_key="k", loras=[(str(tmp_path / "a.gguf"), 1.0)])
    running, base = await _served(config)
    auth = {"Authorization": "Bearer k"}
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(base + "/lora-adapters") as resp:
                assert resp.status == 401 and (await resp.json())["error"]["type"] == "authentication_error"
            async with session.get(base + "/health") as resp:
                assert resp.status == 200
            async with session.post(base + "/lora-adapters", json=[{"id": 0, "scale": 0.5}], headers=auth) as resp:
                assert await resp.json() == {"success": True}
            async with session.get(base + "/lora-adapters", headers=auth) as resp:
                adapters = await resp.json()
    finally:
        await running.close()
    assert adapters == [{"id": 0, "path": str(tmp_path / "a.gguf"), "scale": 0.5, "task_name": "",
                         "prompt_prefix": ""}]


@pytest.mark.parametrize("name", ["013_apply_template", "011_tokenize_openai_style_prompt_field"])
def test_template_and_tokenize_answer_as_captured(engine, name):
    raw = (CAPTURES / f"{name}.req.json").read_text()
    expected = json.loads((CAPTURES / f"{name}.http").read_text().split("\n\n", 1)[1])
    path = "/apply-template" if "template" in name else "/tokenize"
    assert post_json(engine.base_url, path, raw.encode()) == (200, expected)


async def test_slots_fail_on_no_slot_answers_503_only_when_every_slot_is_busy():
    running, base = await _served(_config(time_scale=0.5, n_parallel=1))
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(base + "/slots?fail_on_no_slot=1") as resp:
                assert resp.status == 200
            task = asyncio.create_task(_complete(session, base, {"prompt": "hi", "max_tokens": 200,
                                                                 "ignore_eos": True}))
            status = 200
            while status == 200 and not task.done():
                async with session.get(base + "/slots?fail_on_no_slot=1") as resp:
                    status = resp.status
            await task
    finally:
        await running.close()
    assert status == 503


def test_stop_string_ends_the_task_with_stop_and_the_stopping_word(engine):
    body = json.dumps({"prompt": "abcd" * 4, "n_predict": 100, "ignore_eos": True, "stop": [" "]}).encode()
    status, native = post_json(engine.base_url, "/completion", body)
    assert status == 200 and (native["stop_type"], native["stopping_word"]) == ("word", " ")
    assert len(native["content"]) == 3 and native["tokens_predicted"] == 1
    _, chat = post_json(engine.base_url, "/v1/chat/completions", json.dumps(
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 100, "stop": " "}).encode())
    assert chat["choices"][0]["finish_reason"] == "stop" and len(chat["choices"][0]["message"]["content"]) == 3
    slots = json.loads(fetch_text(engine.base_url, "/slots"))
    assert not any(s["is_processing"] for s in slots)


def _write_tiny_gguf(path) -> None:
    """The captured tiny model's metadata: 2 layers, 64 wide, 512 tokens, 164160 F32 parameters."""
    import numpy as np
    from gguf import GGUFWriter

    writer = GGUFWriter(str(path), "llama")
    for add, field in ((writer.add_block_count, 2), (writer.add_context_length, 2048),
                       (writer.add_embedding_length, 64), (writer.add_head_count, 4), (writer.add_head_count_kv, 2),
                       (writer.add_key_length, 32), (writer.add_file_type, 0)):
        add(field)
    writer.add_token_list([f"t{i}" for i in range(512)])
    writer.add_tensor("weights", np.zeros(164160, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


async def test_a_real_gguf_is_described_in_v1_models_as_captured(tmp_path):
    path = tmp_path / "tiny.gguf"
    _write_tiny_gguf(path)
    running, base = await _served(_config(model=str(path)))
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(base + "/v1/models") as resp:
                card = (await resp.json())["data"][0]
    finally:
        await running.close()
    captured = json.loads((CAPTURES / "004_v1_models.http").read_text().split("\n\n", 1)[1])["data"][0]
    assert card["meta"] == captured["meta"]
    assert card["id"] == str(path) and card["owned_by"] == "llamacpp"


def _captured_body(name: str):
    import re

    raw = (CAPTURES / f"{name}.http").read_text(encoding="utf-8", errors="replace")
    return json.loads(re.split(r"\r?\n\r?\n", raw, maxsplit=1)[1])


def _captured(name: str) -> tuple[dict, dict]:
    from tests.fake_engines.capture_shapes import captured

    return captured(CAPTURES / f"{name}.http")


@pytest.mark.parametrize(("name", "path"), [("023_completions_nonstream_n2_logprobs", "/v1/completions"),
                                            ("024_completions_prompt_list_of_2", "/v1/completions"),
                                            ("026_chat_nonstream_logprobs_top2", "/v1/chat/completions")])
def test_n_prompt_lists_and_logprobs_answer_as_captured(engine, name, path):
    from tests.fake_engines.capture_shapes import shape

    request, expected = _captured(name)
    status, body = post_json(engine.base_url, path, json.dumps({**request, "ignore_eos": True}).encode())
    assert status == 200
    assert [c["index"] for c in body["choices"]] == [c["index"] for c in expected["choices"]]
    assert shape(body) == shape(expected)  # keys in order, logprobs objects, usage and timings
    assert body["usage"]["completion_tokens"] == expected["usage"]["completion_tokens"]  # the first task's


def test_logprobs_line_up_with_the_text_sorted_and_negative(engine):
    status, body = post_json(engine.base_url, "/v1/chat/completions", json.dumps({
        "messages": [{"role": "user", "content": "Tell me a story"}], "max_tokens": 6, "logprobs": True,
        "top_logprobs": 3, "temperature": 0, "ignore_eos": True, "n": 2}).encode())
    assert status == 200 and len(body["choices"]) == 2
    for choice in body["choices"]:
        content = choice["logprobs"]["content"]
        assert "".join(e["token"] for e in content) == choice["message"]["content"] and len(content) == 6
        for entry in content:
            tops = [t["logprob"] for t in entry["top_logprobs"]]
            assert len(tops) == 3 and tops == sorted(tops, reverse=True) and all(v < 0 for v in tops)
            assert entry["top_logprobs"][0]["id"] == entry["id"]  # greedy: the most likely was drawn
            assert entry["bytes"] == list(entry["token"].encode())


def test_streamed_n_and_prompt_lists_send_every_choice_and_its_logprobs(engine):
    req = urllib.request.Request(engine.base_url + "/v1/completions", data=json.dumps({
        "prompt": ["Hello world, the quick brown fox", "Red green blue"], "n": 2, "max_tokens": 3,
        "logprobs": 2, "stream": True, "ignore_eos": True}).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        events = [json.loads(line[6:]) for line in (raw.decode().strip() for raw in resp) if line.startswith("data: {")]
    texts: dict[int, str] = {}
    tokens: dict[int, str] = {}
    for event in events:
        choice = event["choices"][0]
        texts[choice["index"]] = texts.get(choice["index"], "") + choice["text"]
        if choice["logprobs"]:
            tokens[choice["index"]] = tokens.get(choice["index"], "") + "".join(
                e["token"] for e in choice["logprobs"]["content"])
    assert sorted(texts) == [0, 1, 2, 3] and tokens == texts
    assert sum(e["choices"][0]["finish_reason"] == "length" for e in events) == 4


@pytest.mark.parametrize(("name", "method", "path"), [
    ("002_health", "GET", "/health"), ("004_v1_models", "GET", "/v1/models"),
    ("021_chat_stream_include_usage", "POST", "/v1/chat/completions"),
    ("047_err_missing_messages_chat", "POST", "/v1/chat/completions"), ("061_err_empty_body", "POST",
                                                                        "/v1/chat/completions")])
def test_connection_headers_are_the_captured_ones(engine, name, method, path):
    """Keep-Alive on answers below 400, Connection: close on errors, as cpp-httplib sends them."""
    raw = (CAPTURES / f"{name}.http").read_text(encoding="utf-8", errors="replace").replace("\r\n", "\n")
    expected = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in raw.split("\n\n", 1)[0].splitlines()[1:])}
    body = (CAPTURES / f"{name}.req.json").read_bytes() if method == "POST" else None
    host, port = engine.base_url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)  # keep-alive, as curl (urllib asks to close)
    try:
        conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        resp.read()
        headers = {k.lower(): v for k, v in resp.getheaders()}
    finally:
        conn.close()
    for key in ("server", "content-type", "keep-alive", "connection", "access-control-allow-origin"):
        assert headers.get(key) == expected.get(key), key


def test_props_slots_and_native_settings_have_the_captured_keys(engine):
    from tests.fake_engines.capture_shapes import shape

    def body(name: str):
        return _captured_body(name)

    props = json.loads(urllib.request.urlopen(engine.base_url + "/props", timeout=30).read())
    real_props = body("007_props")
    assert list(props) == list(real_props)
    assert shape(props["default_generation_settings"]) == shape(real_props["default_generation_settings"])
    assert shape(props["chat_template_caps"]) == shape(real_props["chat_template_caps"])
    assert props["media_marker"].startswith("<__media_") and len(props["media_marker"]) == len(
        real_props["media_marker"])
    request, real_native = _captured("030_native_completion_nonstream")
    status, native = post_json(engine.base_url, "/completion", json.dumps(request).encode())
    assert status == 200 and list(native["generation_settings"]) == list(real_native["generation_settings"])
    used = [s for s in json.loads(urllib.request.urlopen(engine.base_url + "/slots", timeout=30).read())
            if "params" in s]
    real_slot = body("042_slots_after_prefix_reuse")[0]
    assert used and list(used[0]) == list(real_slot) and list(used[0]["params"]) == list(real_slot["params"])


@pytest.mark.parametrize(("name", "path"), [("043_err_unknown_model_completions", "/v1/completions"),
                                            ("044_err_unknown_model_chat", "/v1/chat/completions")])
async def test_host_prompt_cache_gives_back_a_prompt_after_other_prompts_took_both_slots(name, path):
    """The captures' prompts were served before, then other prompts used both slots: the real
    server still reports all but one prompt token cached (8 of 9, 18 of 19), from --cache-ram."""
    request, expected = _captured(name)
    running, base = await _served(_config())
    try:
        async with aiohttp.ClientSession() as session:
            async def post(body: dict) -> dict:
                async with session.post(base + path, json={**body, "max_tokens": 8}) as resp:
                    assert resp.status == 200
                    return await resp.json()

            await post(request)
            for other in ("Red green blue and yellow " * 3, "Once upon a time in a land far away " * 2):
                await post({"prompt": other} if "prompt" in request else
                           {"messages": [{"role": "user", "content": other}]})
            again = await post(request)
    finally:
        await running.close()
    usage, real = again["usage"], expected["usage"]
    assert real["prompt_tokens_details"]["cached_tokens"] == real["prompt_tokens"] - 1
    assert usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"] - 1
    assert again["timings"]["cache_n"] == usage["prompt_tokens"] - 1


def test_native_n_probs_gives_completion_probabilities_per_token(engine):
    status, body = post_json(engine.base_url, "/completion", json.dumps(
        {"prompt": "Hello world", "n_predict": 5, "n_probs": 3, "ignore_eos": True}).encode())
    probs = body["completion_probabilities"]
    assert status == 200 and len(probs) == 5 and "".join(p["token"] for p in probs) == body["content"]
    for entry in probs:
        assert set(entry) == {"id", "token", "bytes", "logprob", "top_logprobs"} and len(entry["top_logprobs"]) == 3
        tops = [t["logprob"] for t in entry["top_logprobs"]]
        assert tops == sorted(tops, reverse=True) and all(v < 0 for v in tops)
    req = urllib.request.Request(engine.base_url + "/completion", data=json.dumps(
        {"prompt": "Hello world", "n_predict": 4, "n_probs": 2, "ignore_eos": True, "stream": True}).encode(),
        headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        events = [json.loads(line[6:]) for line in (raw.decode().strip() for raw in resp) if line.startswith("data: {")]
    streamed = [p for e in events if not e["stop"] for p in e["completion_probabilities"]]
    assert len(streamed) == 4 and "".join(p["token"] for p in streamed) == "".join(e["content"] for e in events)
