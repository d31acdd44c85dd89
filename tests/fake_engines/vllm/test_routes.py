"""The fake vLLM over real sockets: the official openai SDK, captured shapes and error bodies, invariants."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request

import openai
import pytest

from tests.conftest import DATA
from tests.fake_engines.client import post_json
from tests.fake_engines.scrape import fetch_text, value

CAPTURES = DATA / "real-engines" / "vllm"


def _totals(base: str) -> tuple[float, float]:
    text = fetch_text(base)
    tokens = value(text, "vllm:prompt_tokens_total") + value(text, "vllm:generation_tokens_total")
    return tokens, value(text, "vllm:request_success_total")


def test_openai_sdk_sync_and_async_chat_and_completions_and_usage_matches_token_counters(engine):
    before_tokens, before_success = _totals(engine.base_url)
    client = openai.OpenAI(base_url=engine.base_url + "/v1", api_key="x")
    usages = []
    completion = client.completions.create(model="tiny-llama", prompt="Hello world, the quick brown fox",
                                           max_tokens=8, extra_body={"ignore_eos": True})
    assert completion.choices[0].finish_reason == "length" and completion.usage.completion_tokens == 8
    usages.append(completion.usage.total_tokens)
    chat = client.chat.completions.create(model="tiny-llama", messages=[{"role": "user", "content": "hi"}],
                                          max_tokens=6)
    assert chat.choices[0].message.role == "assistant" and chat.choices[0].message.content
    usages.append(chat.usage.total_tokens)
    stream = client.chat.completions.create(model="tiny-llama", messages=[{"role": "user", "content": "hello"}],
                                            max_tokens=5, stream=True, stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-2].choices[0].finish_reason == "length" and chunks[-1].choices == []
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    usages.append(chunks[-1].usage.total_tokens)
    usages += asyncio.run(_async_calls(engine.base_url))
    after_tokens, after_success = _totals(engine.base_url)
    assert after_tokens - before_tokens == sum(usages)
    assert after_success - before_success == len(usages)


async def _async_calls(base: str) -> list[int]:
    client = openai.AsyncOpenAI(base_url=base + "/v1", api_key="x")
    completion = await client.completions.create(model="tiny-llama", prompt="abcd" * 20, max_tokens=4)
    stream = await client.completions.create(model="tiny-llama", prompt="abcd" * 10, max_tokens=7, stream=True,
                                             stream_options={"include_usage": True},
                                             extra_body={"ignore_eos": True})
    chunks = [chunk async for chunk in stream]
    assert chunks[-2].choices[0].finish_reason == "length" and chunks[-1].usage.completion_tokens == 7
    await client.close()
    return [completion.usage.total_tokens, chunks[-1].usage.total_tokens]


def _captured_error(name: str) -> tuple[dict, dict]:
    raw = (CAPTURES / f"{name}.req.json").read_text()
    request = json.loads(raw) if raw.strip() else {}
    if str(request.get("prompt", "")).startswith("<<long_prompt"):
        request["prompt"] = "abcd" * 3001  # the capture elides its 3001-token prompt
    body = (CAPTURES / f"{name}.http").read_text().split("\n\n", 1)[1]
    return request, json.loads(body)


@pytest.mark.parametrize("name", [
    "037_err_unknown_model_completions", "041_err_missing_messages_chat", "042_err_missing_prompt_completions",
    "046_err_prompt_plus_max_tokens_over_context", "047_err_max_tokens_negative_completions",
    "049_err_max_tokens_zero_completions", "050_err_temperature_wrong_type_completions",
    "052_err_temperature_negative_chat", "053_err_messages_not_a_list", "043_err_prompt_longer_than_context_completions",
])
def test_error_bodies_match_the_captured_vllm_body(engine, name):
    request, expected = _captured_error(name)
    path = "/v1/chat/completions" if "messages" in request or "chat" in name else "/v1/completions"
    status, body = post_json(engine.base_url, path, json.dumps(request).encode())
    assert status == expected["error"]["code"]
    assert body == expected


def test_malformed_and_empty_bodies_answer_like_fastapi(engine):
    status, body = post_json(engine.base_url, "/v1/completions", b'{"model": "tiny-llama", "prompt": "x", "max_tokens"')
    assert status == 400 and body["error"]["type"] == "Bad Request" and body["error"]["param"].startswith("body.")
    _, expected = _captured_error("055_err_empty_body")
    assert post_json(engine.base_url, "/v1/chat/completions", b"") == (400, expected)


def test_unknown_path_and_wrong_method_answer_like_fastapi(engine):
    for path, code, detail in (("/no/such/path", 404, "Not Found"), ("/v1/completions", 405, "Method Not Allowed")):
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(engine.base_url + path, timeout=10)
        assert err.value.code == code and json.loads(err.value.read()) == {"detail": detail}


def test_head_health_is_405_allowing_get(engine):
    req = urllib.request.Request(engine.base_url + "/health", method="HEAD")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=10)
    assert err.value.code == 405 and err.value.headers["allow"] == "GET"


def test_tokenize_and_detokenize_round_trip(engine):
    status, body = post_json(engine.base_url, "/tokenize", json.dumps({"prompt": "Hello world, the quick"}).encode())
    assert status == 200 and body["count"] == 6 and body["max_model_len"] == 2048 and body["token_strs"] is None
    status, back = post_json(engine.base_url, "/detokenize", json.dumps({"tokens": body["tokens"]}).encode())
    assert back == {"prompt": "Hello world, the quick"}


def test_stream_wrong_type_is_coerced_like_pydantic(engine):
    request = {"model": "tiny-llama", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "stream": "yes"}
    req = urllib.request.Request(engine.base_url + "/v1/chat/completions", data=json.dumps(request).encode(),
                                 headers={"Content-Type": "text/plain"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.headers["content-type"] == "text/event-stream; charset=utf-8"
        assert resp.read().decode().endswith("data: [DONE]\n\n")


def test_n_and_prompt_lists_give_one_choice_each_and_usage_as_vllm(engine):
    before = fetch_text(engine.base_url)
    status, body = post_json(engine.base_url, "/v1/completions", json.dumps(
        {"model": "tiny-llama", "prompt": ["abcd" * 3, "abcd" * 5], "n": 2, "max_tokens": 4,
         "ignore_eos": True}).encode())
    after = fetch_text(engine.base_url)
    assert status == 200 and [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    assert all(c["finish_reason"] == "length" and c["text"] for c in body["choices"])
    assert body["usage"] == {"prompt_tokens": 8, "total_tokens": 24, "completion_tokens": 16,
                             "prompt_tokens_details": None, "completion_tokens_details": None}
    # vLLM counts every sample's prompt in the counters, but n once per request
    assert value(after, "vllm:prompt_tokens_total") - value(before, "vllm:prompt_tokens_total") == 16
    assert value(after, "vllm:request_params_n_count") - value(before, "vllm:request_params_n_count") == 2
    assert value(after, "vllm:request_prompt_tokens_count") - value(before, "vllm:request_prompt_tokens_count") == 4


def test_streamed_chat_with_n_2_sends_a_role_chunk_and_a_finish_per_choice(engine):
    client = openai.OpenAI(base_url=engine.base_url + "/v1", api_key="x")
    chunks = list(client.chat.completions.create(model="tiny-llama", messages=[{"role": "user", "content": "hi"}],
                                                 n=2, max_tokens=3, stream=True, stream_options={"include_usage": True},
                                                 extra_body={"ignore_eos": True}))
    roles = [c.choices[0].index for c in chunks if c.choices and c.choices[0].delta.role == "assistant"]
    finished = [c.choices[0].index for c in chunks if c.choices and c.choices[0].finish_reason == "length"]
    assert sorted(roles) == [0, 1] and sorted(finished) == [0, 1]
    assert chunks[-1].usage.completion_tokens == 6


def test_continuous_usage_stats_put_usage_so_far_on_every_chunk(engine):
    client = openai.OpenAI(base_url=engine.base_url + "/v1", api_key="x")
    chunks = list(client.completions.create(model="tiny-llama", prompt="abcd" * 4, max_tokens=3, stream=True,
                                            stream_options={"include_usage": True, "continuous_usage_stats": True},
                                            extra_body={"ignore_eos": True}))
    assert [c.usage.completion_tokens for c in chunks] == [1, 2, 3, 3]
    assert all(c.usage.prompt_tokens == 4 for c in chunks)


def test_stop_string_cuts_the_text_finishes_with_stop_and_counts_a_stop_success(engine):
    request = {"model": "tiny-llama", "prompt": "abcd" * 4, "max_tokens": 200, "ignore_eos": True, "stop": [" "]}
    before = fetch_text(engine.base_url)
    _, body = post_json(engine.base_url, "/v1/completions", json.dumps(request).encode())
    after = fetch_text(engine.base_url)
    choice = body["choices"][0]
    # every generated token is a 3-letter word and a space: the first token already holds the stop string
    assert (choice["finish_reason"], choice["stop_reason"], len(choice["text"])) == ("stop", " ", 3)
    assert body["usage"]["completion_tokens"] == 1
    stops = [value(t, "vllm:request_success_total", finished_reason="stop") for t in (before, after)]
    assert stops[1] - stops[0] == 1
    assert value(after, "vllm:num_requests_running") == 0


def _sse_events(text: str) -> list[dict]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]


@pytest.mark.parametrize(("name", "path"), [("019_chat_stream_no_stream_options", "/v1/chat/completions"),
                                            ("016_completions_stream_no_stream_options", "/v1/completions"),
                                            ("018_chat_stream_include_usage", "/v1/chat/completions")])
def test_stream_events_carry_the_fingerprint_where_vllm_puts_it(engine, name, path):
    """On the finish event when no usage event follows, else on the usage event only."""
    request = json.loads((CAPTURES / f"{name}.req.json").read_text())
    expected = _sse_events((CAPTURES / f"{name}.http").read_text(encoding="utf-8", errors="replace"))
    req = urllib.request.Request(engine.base_url + path, data=json.dumps({**request, "ignore_eos": True}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        events = _sse_events(resp.read().decode())

    def keys(event: dict) -> list[str]:
        return list(event) + [f"choices.{k}" for c in event["choices"] for k in c]

    assert [keys(e) for e in events[-2:]] == [keys(e) for e in expected[-2:]]
    # only the last event before [DONE] carries it: the finish event, or the usage event when asked for
    assert [i for i, e in enumerate(events) if "system_fingerprint" in e] == [len(events) - 1]
    assert [i for i, e in enumerate(expected) if "system_fingerprint" in e] == [len(expected) - 1]


@pytest.mark.parametrize(("name", "method", "path"), [
    ("004_v1_models", "GET", "/v1/models"), ("014_completions_nonstream", "POST", "/v1/completions"),
    ("012_unknown_path_404", "GET", "/v1/does-not-exist"), ("002_health", "GET", "/health"),
    ("018_chat_stream_include_usage", "POST", "/v1/chat/completions")])
def test_headers_are_the_captured_ones(engine, name, method, path):
    """server, content-type (plain application/json), vary: Origin; values aside from lengths and dates."""
    raw = (CAPTURES / f"{name}.http").read_text(encoding="utf-8", errors="replace").replace("\r\n", "\n")
    head = raw.split("\n\n", 1)[0].splitlines()[1:]
    expected = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in head)}
    body = (CAPTURES / f"{name}.req.json").read_bytes() if method == "POST" else None
    req = urllib.request.Request(engine.base_url + path, data=body, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            resp.read()
            headers = {k.lower(): v for k, v in resp.headers.items()}
    except urllib.error.HTTPError as err:
        headers = {k.lower(): v for k, v in err.headers.items()}
    for key in ("server", "content-type", "vary"):
        assert headers.get(key) == expected.get(key), key
