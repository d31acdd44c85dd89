"""OpenAI Responses request conversion and answer shapes, as llama-server's server-chat.cpp and server-task.cpp build them."""

from __future__ import annotations

import pytest

from fake_engines.llamacpp import responses
from fake_engines.llamacpp.errors import LlamaError


def test_input_items_become_chat_messages_with_assistant_items_merged() -> None:
    body = {
        "model": "gpt-4.1", "instructions": "Book", "max_output_tokens": 8, "temperature": 0.8,
        "reasoning": {"effort": "low"},
        "tools": [{"type": "function", "name": "f", "parameters": {}}, {"type": "web_search"}],
        "input": [
            {"role": "user", "content": "What is the best book"},
            {"role": "assistant", "type": "message", "status": "completed",
             "content": [{"type": "output_text", "text": "Dune"}]},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "think"}]},
            {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_text", "text": "ok"}]},
            {"role": "developer", "content": [{"type": "input_image", "image_url": "http://x/i.png"}]},
        ],
    }
    chat = responses.to_chat_body(body)
    assert chat["messages"] == [
        {"role": "system", "content": "Book"},
        {"role": "user", "content": [{"text": "What is the best book", "type": "text"}]},
        {"role": "assistant", "content": [{"text": "Dune", "type": "text"}], "reasoning_content": "think",
         "tool_calls": [{"function": {"arguments": "{}", "name": "f"}, "id": "c1", "type": "function"}]},
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "ok"}]},
        {"role": "developer", "content": [{"image_url": {"url": "http://x/i.png"}, "type": "image_url"}]},
    ]
    assert chat["tools"] == [{"type": "function", "function": {"name": "f", "parameters": {}, "strict": True}}]
    assert chat["max_tokens"] == 8 and chat["reasoning_effort"] == "low" and chat["temperature"] == 0.8
    assert not {"input", "instructions", "max_output_tokens", "reasoning"} & set(chat)


@pytest.mark.parametrize(("body", "message"), [
    ({}, "'input' is required"),
    ({"input": "x", "previous_response_id": "resp_1"}, "llama.cpp does not support 'previous_response_id'."),
    ({"input": 3}, "'input' must be a string or array of objects"),
    ({"input": [{"type": "mystery"}]}, "Cannot determine type of 'item'"),
    ({"input": [{"role": "user", "content": [{"type": "input_file"}]}]},
     "'input_file' is not supported by llamacpp at this moment"),
    ({"input": [{"type": "reasoning", "summary": [], "content": []}]}, "item['content'] is empty"),
    ({"input": "x", "tools": {}}, "'tools' must be an array of objects"),
])
def test_malformed_requests_are_400_with_llama_servers_words(body: dict, message: str) -> None:
    with pytest.raises(LlamaError) as err:
        responses.to_chat_body(body)
    assert (err.value.status, err.value.message) == (400, message)


def test_stream_events_wrap_the_text_in_one_message_item() -> None:
    ids = responses.ResponseIds("resp_1", "msg_1")
    events = responses.created_events(ids) + responses.text_events(ids, "Hi", first=True)
    events += responses.text_events(ids, " there", first=False)
    events += responses.closing_events(ids, "m", "Hi there", responses.usage(5, 2, 2), 100)
    assert [name for name, _ in events] == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "response.completed"]
    assert all(data["type"] == name for name, data in events)
    completed = events[-1][1]["response"]
    assert completed["output"][0]["id"] == "msg_1" and completed["output"][0]["content"][0]["text"] == "Hi there"
    assert completed["usage"] == {"input_tokens": 5, "output_tokens": 2, "total_tokens": 7,
                                  "input_tokens_details": {"cached_tokens": 2}}
    assert responses.response_body(ids, "m", "", completed["usage"], 100)["output"] == []
    fresh = responses.ResponseIds.new()
    assert fresh.response.startswith("resp_") and len(fresh.message) == len("msg_") + 32
