"""The fake llama-server's Anthropic /v1/messages, OpenAI /v1/responses and input_tokens routes over real
sockets: the openai SDK's Responses client, raw event streams, token counts and errors."""

from __future__ import annotations

import json

import openai
import pytest

from fake_engines.llamacpp.config import LlamaServerConfig
from fake_engines.llamacpp.server import start_llama
from tests.fake_engines.client import post
from tests.fake_engines.engine_thread import EngineThread

MODEL = "llama-3.1-8b-Q4_K_M.gguf"


@pytest.fixture(scope="module")
def engine():
    config = LlamaServerConfig(model=MODEL, port=0, time_scale=0.01, n_parallel=2, n_ctx=2048)
    with EngineThread(lambda: start_llama(config, cold_start=False)) as running:
        yield running


def _events(text: str) -> list[tuple[str, dict]]:
    """Each event's `event:` name and `data:` object (every event names itself)."""
    out = []
    for block in filter(None, text.split("\n\n")):
        name, data = block.split("\n")
        assert name.startswith("event: ") and data.startswith("data: ")
        out.append((name[len("event: "):], json.loads(data[len("data: "):])))
    return out


def test_anthropic_message_whole_and_streamed_and_its_token_count(engine) -> None:
    body = {"model": "claude", "max_tokens": 6, "system": "You are brief.",
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Say"}, {"type": "text", "text": " hi"}]}]}
    status, _, text = post(engine.base_url, "/v1/messages/count_tokens", body)
    count = json.loads(text)
    assert status == 200 and set(count) == {"input_tokens"} and count["input_tokens"] > 0
    status, _, text = post(engine.base_url, "/v1/messages", {**body, "metadata": {"user_id": "u"}, "top_k": 4})
    message = json.loads(text)
    assert status == 200 and message["id"].startswith("chatcmpl-") and message["model"] == MODEL
    assert message["type"] == "message" and message["role"] == "assistant" and "timings" not in message
    assert message["content"][0]["type"] == "text" and message["content"][0]["text"]
    assert message["stop_reason"] in ("end_turn", "max_tokens") and message["stop_sequence"] is None
    usage = message["usage"]
    assert usage["input_tokens"] + usage["cache_read_input_tokens"] == count["input_tokens"]
    assert 0 < usage["output_tokens"] <= 6
    status, ctype, text = post(engine.base_url, "/v1/messages", {**body, "stream": True})
    assert status == 200 and ctype.startswith("text/event-stream")
    events = _events(text)
    names = [name for name, _ in events]
    assert names[:2] == ["message_start", "content_block_start"] and names[-3:] == [
        "content_block_stop", "message_delta", "message_stop"]
    assert set(names[2:-3]) == {"content_block_delta"} and all(d["type"] == n for n, d in events)
    deltas = [d["delta"] for n, d in events if n == "content_block_delta"]
    assert all(d["type"] == "text_delta" for d in deltas)
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None
    assert start["usage"]["input_tokens"] + start["usage"]["cache_read_input_tokens"] == count["input_tokens"]
    assert start["usage"]["cache_read_input_tokens"] > 0  # the same prompt a moment ago
    assert events[-2][1]["usage"]["output_tokens"] > 0 and "timings" not in events[-1][1]


def test_anthropic_stop_sequence_ends_the_turn_and_is_named(engine) -> None:
    # every generated word ends in a space: the first one meets the stop sequence
    status, _, text = post(engine.base_url, "/v1/messages", {
        "max_tokens": 20, "stop_sequences": [" "], "messages": [{"role": "user", "content": "Count"}]})
    message = json.loads(text)
    assert status == 200 and message["stop_reason"] == "end_turn" and message["stop_sequence"] == " "
    assert " " not in message["content"][0]["text"]


def test_input_tokens_counters_agree_with_the_chat_prompt(engine) -> None:
    messages = [{"role": "system", "content": "Book"}, {"role": "user", "content": "What is the best book"}]
    status, _, text = post(engine.base_url, "/chat/completions/input_tokens", {"messages": messages})
    counted = json.loads(text)
    assert status == 200 and counted["object"] == "response.input_tokens" and counted["input_tokens"] > 5
    status, _, text = post(engine.base_url, "/v1/chat/completions", {"messages": messages, "max_tokens": 1})
    assert json.loads(text)["usage"]["prompt_tokens"] == counted["input_tokens"]
    status, _, text = post(engine.base_url, "/v1/responses/input_tokens",
                           {"instructions": "Book", "input": "What is the best book"})
    assert json.loads(text) == counted
    anthropic = {"system": "Book", "messages": [{"role": "user", "content": "What is the best book"}]}
    assert json.loads(post(engine.base_url, "/v1/messages/count_tokens", anthropic)[2]) == {
        "input_tokens": counted["input_tokens"]}


def test_openai_sdk_responses_whole_and_streamed(engine) -> None:
    client = openai.OpenAI(base_url=engine.base_url + "/v1", api_key="x")
    messages = [{"role": "system", "content": "Book"}, {"role": "user", "content": "What is the best book"}]
    res = client.responses.create(model="gpt-4.1", input=messages, max_output_tokens=8, temperature=0.8)
    assert res.id.startswith("resp_") and res.output[0].id.startswith("msg_") and res.output_text
    assert res.status == "completed" and 0 < res.usage.output_tokens <= 8
    gathered, ids, completed = "", set(), None
    for event in client.responses.create(model="gpt-4.1", input=messages, max_output_tokens=8, stream=True):
        if event.type == "response.output_text.delta":
            gathered += event.delta
            ids.add(event.item_id)
        if event.type == "response.completed":
            completed = event.response
    assert completed is not None and completed.output_text == gathered and ids == {completed.output[0].id}
    status, _, text = post(engine.base_url, "/responses", {
        "input": "This is a test" * 10, "max_output_tokens": 4, "stream": True, "timings_per_token": True,
        "return_progress": True})
    events = _events(text)
    progress = [d for _, d in events if "prompt_progress" in d]
    assert progress and progress[0]["type"] == "response.in_progress" and progress[0]["prompt_progress"]["total"] > 0
    report = progress[0]["prompt_progress"]  # /completion's last report: the whole prompt, whole milliseconds
    assert report["processed"] == report["total"] and isinstance(report["time_ms"], int)
    assert all("timings" in d for n, d in events if n == "response.output_text.delta")
    assert events[-1][0] == "response.completed" and "timings" in events[-1][1]


def test_errors_keep_llama_servers_envelope_and_status(engine) -> None:
    status, _, text = post(engine.base_url, "/v1/messages", {"max_tokens": 5})
    assert status == 500 and json.loads(text)["error"] == {"code": 500, "message": "'messages' is required",
                                                          "type": "server_error"}
    status, _, text = post(engine.base_url, "/v1/responses", {"max_output_tokens": 5})
    assert status == 400 and json.loads(text)["error"]["message"] == "'input' is required"
    status, _, text = post(engine.base_url, "/v1/messages", {"max_tokens": 5, "messages": [{"role": "user"}]})
    assert status == 400 and "must contain 'content'" in json.loads(text)["error"]["message"]
    status, _, text = post(engine.base_url, "/v1/messages", {"max_tokens": 5, "messages": []})
    assert status == 200 and json.loads(text)["type"] == "message"  # permissive, as llama-server
