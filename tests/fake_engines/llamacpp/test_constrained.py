"""Text a request constrains (grammar, json_schema, response_format, logit_bias), determinism per
seed and prompt, n_probs, batched prompts and response_fields, over a real socket."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request

import jsonschema
import pytest

from fake_engines.llamacpp.config import LlamaServerConfig
from fake_engines.llamacpp.server import start_llama
from tests.fake_engines.client import post_json
from tests.fake_engines.engine_thread import EngineThread

MESSAGES = [{"role": "user", "content": "Write an example"}]


@pytest.fixture(scope="module")
def engine():
    config = LlamaServerConfig(model="llama-3.1-8b-Q4_K_M.gguf", port=0, time_scale=0.001, n_parallel=2, n_ctx=2048)
    with EngineThread(lambda: start_llama(config, cold_start=False)) as running:
        yield running


def _stream_text(base: str, body: dict) -> str:
    req = urllib.request.Request(base + "/completion", data=json.dumps({**body, "stream": True}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        lines = [line[6:] for line in resp.read().decode().splitlines() if line.startswith("data: ")]
    return "".join(json.loads(line)["content"] for line in lines)


def test_grammar_and_schemas_shape_the_text_and_bad_ones_are_400_as_llama_server(engine):
    base = engine.base_url
    status, body = post_json(base, "/completion",
                             {"prompt": "x", "n_predict": 32, "grammar": 'root ::= "ab"{2} [0-9]+'})
    assert status == 200 and re.fullmatch(r"abab[0-9]+", body["content"]) and body["stop_type"] == "eos"
    assert body["generation_settings"]["grammar"] == 'root ::= "ab"{2} [0-9]+'
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 9}},
              "required": ["n"], "additionalProperties": False}
    for extra in ({"json_schema": schema}, {"response_format": {"type": "json_schema", "json_schema": {"schema": schema}}}):
        status, body = post_json(base, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 40, **extra})
        assert status == 200
        jsonschema.validate(json.loads(body["choices"][0]["message"]["content"]), schema)
    status, body = post_json(base, "/v1/chat/completions",
                             {"messages": MESSAGES, "response_format": {"type": "json_object"}})
    assert status == 200 and isinstance(json.loads(body["choices"][0]["message"]["content"]), dict)
    refused = [({"grammar": "root ::= this is (not valid GBNF"}, "Failed to initialize samplers: failed to parse grammar"),
               ({"response_format": {"type": "sound"}}, 'response_format type must be one of "text" or "json_object", but got: sound'),
               ({"grammar": 'root ::= "a"', "tools": [{"type": "function", "function": {"name": "f"}}]},
                "Cannot use custom grammar constraints with tools."),
               ({"response_format": {"type": "json_object", "schema": {"type": "hiccup"}}},
                'JSON schema conversion failed:\nUnrecognized schema: {"type":"hiccup"}')]
    for extra, message in refused:
        status, body = post_json(base, "/v1/chat/completions", {"messages": MESSAGES, **extra})
        assert (status, body["error"]["message"], body["error"]["type"]) == (400, message, "invalid_request_error")


def test_same_seed_and_prompt_give_the_same_text_streamed_or_not_and_another_seed_another(engine):
    base = engine.base_url
    body = {"prompt": "I believe the meaning of life is", "n_predict": 16, "seed": 42, "temperature": 1.0}
    texts = {post_json(base, "/completion", body)[1]["content"] for _ in range(3)}
    assert len(texts) == 1 and _stream_text(base, body) in texts
    others = {post_json(base, "/completion", {**body, "seed": seed})[1]["content"] for seed in range(4)}
    assert len(others) == 4
    greedy = {post_json(base, "/completion", {**body, "seed": seed, "temperature": 0})[1]["content"]
              for seed in range(3)}
    assert len(greedy) == 1  # temperature 0: the seed does not matter
    fresh = {post_json(base, "/completion", {**body, "seed": -1})[1]["content"] for _ in range(3)}
    assert len(fresh) == 3  # -1: llama-server draws a new seed for each request


def test_logit_bias_strings_keep_their_words_out_and_ignore_eos_biases_eos(engine):
    banned = ["the", "and", "you", "was", "her", "his", "she"]
    status, body = post_json(engine.base_url, "/completion", {"prompt": "What is the best book", "n_predict": 64,
                                                             "ignore_eos": True,
                                                             "logit_bias": [[f" {w} ", False] for w in banned]})
    assert status == 200 and len(body["content"].split()) == 64
    assert not set(body["content"].split()) & set(banned)
    assert {"bias": None, "token": 2} in body["generation_settings"]["logit_bias"]


def test_batched_and_object_prompts_n_probs_and_response_fields(engine):
    base = engine.base_url
    _, tokens = post_json(base, "/tokenize", {"content": "Hello there", "add_special": True})
    status, body = post_json(base, "/completion", {
        "prompt": [tokens["tokens"], "Hello there", {"prompt_string": "Hello there"}], "n_predict": 4, "temperature": 0})
    assert status == 200 and isinstance(body, list) and len({b["content"] for b in body}) == 1
    assert [b["index"] for b in body] == [0, 1, 2] and body[0]["prompt"] == "<s>Hello there"
    req = urllib.request.Request(base + "/completion", headers={"Content-Type": "application/json"}, data=json.dumps(
        {"prompt": ["a", "b"], "n_predict": 2, "stream": True}).encode())
    with urllib.request.urlopen(req, timeout=30) as resp:
        chunks = [json.loads(line[6:]) for line in resp.read().decode().splitlines() if line.startswith("data: ")]
    assert sorted(c["index"] for c in chunks if c["stop"]) == [0, 1] and {c["index"] for c in chunks} == {0, 1}
    status, _ = post_json(base, "/completion", {"prompt": {"prompt_string": "x", "multimodal_data": ["AAAA"]}})
    assert status == 400
    status, body = post_json(base, "/completion", {"prompt": [1, 2, 10**12]})
    assert (status, body["error"]["message"]) == (400, "Prompt contains invalid tokens")
    status, body = post_json(base, "/completion", {"prompt": "x", "n_predict": 3, "n_probs": 5,
                                                   "post_sampling_probs": True, "ignore_eos": True})
    probs = body["completion_probabilities"]
    assert len(probs) == 3 and all(0 < p["prob"] <= 1 and len(p["top_probs"]) == 5 for p in probs)
    status, body = post_json(base, "/completion", {"prompt": "x", "n_predict": 3,
                                                   "response_fields": ["content", "generation_settings/n_predict"]})
    assert set(body) == {"content", "generation_settings/n_predict"} and body["generation_settings/n_predict"] == 3


def test_return_progress_reports_the_prompt_before_the_first_token(engine):
    body = {"messages": [{"role": "user", "content": "This is a test" * 10}], "max_tokens": 3, "stream": True,
            "return_progress": True}
    req = urllib.request.Request(engine.base_url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        events = [json.loads(line[6:]) for line in resp.read().decode().splitlines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
    reports = [e["prompt_progress"] for e in events if "prompt_progress" in e]
    first_text = next(i for i, e in enumerate(events) if e["choices"] and e["choices"][0]["delta"].get("content"))
    assert reports and all("prompt_progress" not in e for e in events[first_text:])
    assert reports[0]["processed"] == reports[0]["cache"] and reports[-1]["processed"] == reports[-1]["total"] > 0
    assert all(a["processed"] < b["processed"] for a, b in zip(reports, reports[1:], strict=False))


def test_progress_reports_carry_the_slot_timings_only_with_timings_per_token(engine):
    def progress(extra: dict) -> list[dict]:
        body = {"prompt": "wxyz" * 200, "n_predict": 2, "stream": True, "return_progress": True, "cache_prompt": False,
                **extra}
        req = urllib.request.Request(engine.base_url + "/completion", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            events = [json.loads(line[6:]) for line in resp.read().decode().splitlines() if line.startswith("data: ")]
        return [e for e in events if "prompt_progress" in e]

    assert all("timings" not in e for e in progress({}))
    reports = progress({"timings_per_token": True})
    first = reports[0]["timings"]
    assert (first["prompt_n"], first["prompt_ms"], first["predicted_n"], first["predicted_ms"]) == (0, 0.0, 0, 0.0)
    assert all(v is not None and v >= 0 for e in reports for v in e["timings"].values())
    assert all(a["timings"]["prompt_ms"] <= b["timings"]["prompt_ms"] for a, b in zip(reports, reports[1:], strict=False))
    last = reports[-1]
    assert last["timings"]["prompt_n"] == last["prompt_progress"]["processed"] - last["prompt_progress"]["cache"] > 0
    assert last["timings"]["prompt_ms"] > 0
