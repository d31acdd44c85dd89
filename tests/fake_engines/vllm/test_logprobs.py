"""fake-vllm's logprobs and echo over real sockets, in the shapes of the real vLLM 0.32 captures."""

from __future__ import annotations

import json
import math
import urllib.request

import pytest

from fake_engines.core import encode
from fake_engines.driver.logprobs import request_logprobs
from tests.conftest import DATA
from tests.fake_engines.capture_shapes import captured, shape
from tests.fake_engines.client import post_json

CAPTURES = DATA / "real-engines" / "vllm"


def _stream(base: str, path: str, body: dict) -> list[dict]:
    req = urllib.request.Request(base + path, data=json.dumps({**body, "stream": True}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        lines = [line.decode().strip() for line in resp]
    return [json.loads(line[6:]) for line in lines if line.startswith("data: {")]


def _plausible(values: list[float]) -> None:
    assert values and all(isinstance(v, float) and v < 0 and math.isfinite(v) for v in values)


@pytest.mark.parametrize(("name", "path"), [("020_completions_nonstream_n2_logprobs", "/v1/completions"),
                                            ("023_chat_nonstream_logprobs_top2", "/v1/chat/completions")])
def test_logprobs_bodies_have_the_captured_shape(engine, name, path):
    request, expected = captured(CAPTURES / f"{name}.http")
    status, body = post_json(engine.base_url, path, {**request, "ignore_eos": True})
    assert status == 200
    assert shape(body["choices"][0]["logprobs"]) == shape(expected["choices"][0]["logprobs"])
    assert [c["index"] for c in body["choices"]] == [c["index"] for c in expected["choices"]]
    assert list(body) == list(expected) and list(body["choices"][0]) == list(expected["choices"][0])


def test_completion_logprobs_line_up_with_the_text_and_are_a_function_of_seed_and_context(engine):
    prompt = "Hello world, the quick brown fox"
    request = {"model": "tiny-llama", "prompt": prompt, "max_tokens": 6, "logprobs": 3, "seed": 7,
               "temperature": 0, "ignore_eos": True}
    first = post_json(engine.base_url, "/v1/completions", request)[1]["choices"][0]
    logprobs = first["logprobs"]
    token_ids = [encode(t)[0] for t in logprobs["tokens"]]
    expected = request_logprobs(7, encode(prompt), 0, token_ids, 3)
    assert logprobs["token_logprobs"] == [e.chosen.logprob for e in expected]
    assert "".join(logprobs["tokens"]) == first["text"] and len(logprobs["tokens"]) == 6
    assert logprobs["text_offset"] == [sum(len(t) for t in logprobs["tokens"][:i]) for i in range(6)]
    _plausible(logprobs["token_logprobs"])
    for chosen, lp, top in zip(logprobs["tokens"], logprobs["token_logprobs"], logprobs["top_logprobs"], strict=True):
        assert next(iter(top)) == chosen and top[chosen] == lp  # the sampled token first, as vLLM
        assert len(top) == 3 and list(top.values())[1:] == sorted(list(top.values())[1:], reverse=True)
        assert lp == max(top.values())  # greedy: the chosen token is the most likely


def test_chat_top_logprobs_sorted_with_bytes(engine):
    status, body = post_json(engine.base_url, "/v1/chat/completions", {
        "model": "tiny-llama", "messages": [{"role": "user", "content": "Tell me a story"}], "max_tokens": 5,
        "logprobs": True, "top_logprobs": 4, "temperature": 0, "ignore_eos": True})
    content = body["choices"][0]["logprobs"]["content"]
    assert status == 200 and "".join(c["token"] for c in content) == body["choices"][0]["message"]["content"]
    for entry in content:
        tops = [t["logprob"] for t in entry["top_logprobs"]]
        assert len(tops) == 4 and tops == sorted(tops, reverse=True) and entry["logprob"] == tops[0]
        assert entry["bytes"] == list(entry["token"].encode())
        _plausible(tops)


def test_logprobs_true_without_top_logprobs_gives_empty_lists_and_none_when_not_asked(engine):
    chat = {"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    asked = post_json(engine.base_url, "/v1/chat/completions", {**chat, "logprobs": True})[1]["choices"][0]
    assert [e["top_logprobs"] for e in asked["logprobs"]["content"]] == [[]] * len(asked["logprobs"]["content"])
    assert post_json(engine.base_url, "/v1/chat/completions", chat)[1]["choices"][0]["logprobs"] is None


@pytest.mark.parametrize(("path", "extra", "message"), [
    ("/v1/completions", {"logprobs": 21}, "Requested sample logprobs of 21, which is greater than max allowed: 20"),
    ("/v1/completions", {"logprobs": -2}, "`logprobs` must be a positive value or -1."),
    ("/v1/chat/completions", {"top_logprobs": 2}, "when using `top_logprobs`, `logprobs` must be set to true."),
])
def test_logprobs_out_of_range_are_400s_in_vllms_words(engine, path, extra, message):
    body = {"model": "tiny-llama", "max_tokens": 2, **extra,
            **({"messages": [{"role": "user", "content": "x"}]} if "chat" in path else {"prompt": "x"})}
    status, answer = post_json(engine.base_url, path, body)
    assert status == 400 and answer["error"]["message"].startswith(message)


def test_streamed_logprobs_cover_every_token_at_its_position(engine):
    prompt = "Once upon a time"
    request = {"model": "tiny-llama", "prompt": prompt, "max_tokens": 5, "logprobs": 2, "seed": 3, "ignore_eos": True}
    events = [c for c in _stream(engine.base_url, "/v1/completions", request) if c["choices"]]
    text = "".join(c["choices"][0]["text"] for c in events)
    chunks = [c["choices"][0]["logprobs"] for c in events if c["choices"][0]["logprobs"]]
    tokens = [t for c in chunks for t in c["tokens"]]
    assert "".join(tokens) == text and len(tokens) == 5
    assert [o for c in chunks for o in c["text_offset"]] == [len("".join(tokens[:i])) for i in range(5)]
    expected = request_logprobs(3, encode(prompt), 0, [encode(t)[0] for t in tokens], 2, sampled=True)
    assert [v for c in chunks for v in c["token_logprobs"]] == [e.chosen.logprob for e in expected]
    chat = {"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
            "logprobs": True, "top_logprobs": 2, "ignore_eos": True}
    events = [c for c in _stream(engine.base_url, "/v1/chat/completions", chat) if c["choices"]]
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in events)
    entries = [e for c in events if c["choices"][0]["logprobs"] for e in c["choices"][0]["logprobs"]["content"]]
    assert "".join(e["token"] for e in entries) == content and len(entries) == 4
    assert all(len(e["top_logprobs"]) == 2 for e in entries)


def test_echo_puts_the_prompt_before_the_text_and_its_tokens_before_the_logprobs(engine):
    prompt = "Hello world, the quick brown fox"
    choice = post_json(engine.base_url, "/v1/completions", {"model": "tiny-llama", "prompt": prompt, "max_tokens": 3,
                                                            "echo": True, "logprobs": 1, "ignore_eos": True})[1]["choices"][0]
    assert choice["text"].startswith(prompt) and len(choice["text"]) > len(prompt)
    logprobs = choice["logprobs"]
    assert "".join(logprobs["tokens"]) == choice["text"]
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    _plausible(logprobs["token_logprobs"][1:])
    streamed = "".join(c["choices"][0]["text"] for c in _stream(
        engine.base_url, "/v1/completions", {"model": "tiny-llama", "prompt": prompt, "max_tokens": 3, "echo": True}))
    assert streamed.startswith(prompt) and len(streamed) > len(prompt)


def test_prompt_logprobs_score_every_prompt_token_but_the_first(engine):
    prompt = "Hello world, the quick brown fox"
    choice = post_json(engine.base_url, "/v1/completions", {"model": "tiny-llama", "prompt": prompt, "max_tokens": 2,
                                                            "prompt_logprobs": 2})[1]["choices"][0]
    scored = choice["prompt_logprobs"]
    assert len(scored) == len(encode(prompt)) and scored[0] is None
    for token_id, entry in zip(encode(prompt)[1:], scored[1:], strict=True):
        assert str(token_id) in entry and 2 <= len(entry) <= 3  # the prompt's token and the 2 likeliest
        assert all(set(v) == {"logprob", "rank", "decoded_token"} and v["logprob"] < 0 for v in entry.values())
        assert sorted(v["rank"] for v in entry.values())[:2] == [1, 2]
    chat = post_json(engine.base_url, "/v1/chat/completions", {
        "model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
        "prompt_logprobs": 1})[1]
    assert chat["prompt_logprobs"][0] is None and all(len(e) >= 1 for e in chat["prompt_logprobs"][1:])
    status, error = post_json(engine.base_url, "/v1/completions", {"model": "tiny-llama", "prompt": prompt,
                                                                   "prompt_logprobs": 1, "stream": True})
    assert status == 400 and error["error"]["message"].startswith(
        "`prompt_logprobs` are not available when `stream=True`.")
