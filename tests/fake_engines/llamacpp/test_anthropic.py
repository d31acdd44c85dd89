"""Anthropic request conversion and answer shapes, as llama-server's server-chat.cpp and server-task.cpp build them."""

from __future__ import annotations

import pytest

from fake_engines.llamacpp import anthropic
from fake_engines.llamacpp.errors import LlamaError

PNG = "iVBORw0KGgo="


def test_conversion_splits_blocks_into_chat_messages_as_llama_server_does() -> None:
    body = {
        "model": "claude-x", "system": [{"type": "text", "text": "be "}, {"type": "image"}, {"type": "text", "text": "brief"}],
        "messages": [
            {"role": "user", "content": "What's the weather?"},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "check"},
                                              {"type": "tool_use", "id": "t1", "name": "get", "input": {"city": "P"}}]},
            {"role": "user", "content": [
                {"type": "text", "text": "Results:"},
                {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "Sun"},
                                                                         {"type": "text", "text": "ny"}]},
                {"type": "tool_result", "tool_use_id": "t2", "content": [
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}]},
                {"type": "tool_result", "tool_use_id": "t3"},
                {"type": "document", "source": {}}]},
            {"role": "assistant"},
        ],
        "tools": [{"name": "get", "description": "d", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "any"}, "stop_sequences": ["END"], "top_k": 40, "stream": True,
        "thinking": {"type": "enabled", "budget_tokens": 50}, "metadata": {"user_id": "u1"}, "n_probs": 3,
    }
    chat = anthropic.to_chat_body(body)
    assert chat["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "What's the weather?"},
        {"role": "assistant", "content": "", "reasoning_content": "check", "tool_calls": [
            {"id": "t1", "type": "function", "function": {"name": "get", "arguments": '{"city":"P"}'}}]},
        {"role": "user", "content": [{"type": "text", "text": "Results:"}]},
        {"role": "tool", "tool_call_id": "t1", "content": "Sunny"},
        {"role": "tool", "tool_call_id": "t2", "content": [
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}}]},
        {"role": "tool", "tool_call_id": "t3", "content": ""},
    ]
    assert chat["tools"] == [{"type": "function", "function": {"name": "get", "description": "d",
                                                               "parameters": {"type": "object"}}}]
    assert chat["tool_choice"] == "required" and chat["stop"] == ["END"] and chat["max_tokens"] == 4096
    assert chat["top_k"] == 40 and chat["stream"] is True and chat["thinking_budget_tokens"] == 50
    assert chat["__metadata_user_id"] == "u1" and "model" not in chat and "n_probs" not in chat


def test_missing_messages_is_a_server_error_and_a_billing_stamp_is_blanked() -> None:
    with pytest.raises(LlamaError) as err:
        anthropic.to_chat_body({"max_tokens": 5})
    assert err.value.status == 500 and err.value.message == "'messages' is required"
    system = "x-anthropic-billing-header: cc_version=2.1; cch=a5145;You are Claude Code."
    chat = anthropic.to_chat_body({"system": system, "messages": []})
    assert chat["messages"] == [{"role": "system",
                                 "content": "x-anthropic-billing-header: cc_version=2.1; cch=fffff;You are Claude Code."}]
    assert anthropic.normalize_billing_header("x-anthropic-billing-header: cch=abc") == \
        "x-anthropic-billing-header: cch=abc"


def test_message_body_orders_thinking_text_tool_use_and_maps_the_stop_reason() -> None:
    reply = anthropic.Reply(text="hi", reasoning="hmm", tool_calls=({"id": "c", "name": "f", "arguments": "{bad"},))
    use = anthropic.usage(10, 4, 3)
    body = anthropic.message_body("chatcmpl-1", "m", reply, anthropic.stop_reason("stop", reply), "", use)
    assert [b["type"] for b in body["content"]] == ["thinking", "text", "tool_use"]
    assert body["content"][0]["signature"] == "" and body["content"][2]["input"] == {}
    assert body["stop_reason"] == "tool_use" and body["stop_sequence"] is None and "timings" not in body
    assert body["usage"] == {"cache_read_input_tokens": 4, "input_tokens": 6, "output_tokens": 3}
    assert anthropic.stop_reason("length", reply) == "max_tokens"
    assert anthropic.stop_reason("stop", anthropic.Reply(text="x")) == "end_turn"


def test_stream_events_open_each_block_once_in_order_and_close_them_before_message_delta() -> None:
    stream = anthropic.MessageStream("chatcmpl-1", "m")
    events = stream.start(12, 2) + stream.start(12, 2)
    events += stream.delta(reasoning="th") + stream.delta(reasoning="ink")
    events += stream.delta(text="Hel") + stream.delta(text="lo")
    events += stream.delta(tool_call={"id": "c1", "name": "calc", "arguments": '{"x":1}'})
    events += stream.close("tool_use", "", 9)
    summary = [(name, data.get("index"), (data.get("delta") or data.get("content_block") or {}).get("type"))
               for name, data in events]
    assert summary == [
        ("message_start", None, None),
        ("content_block_start", 0, "thinking"), ("content_block_delta", 0, "thinking_delta"),
        ("content_block_delta", 0, "thinking_delta"),
        ("content_block_start", 1, "text"), ("content_block_delta", 1, "text_delta"),
        ("content_block_delta", 1, "text_delta"),
        ("content_block_start", 2, "tool_use"), ("content_block_delta", 2, "input_json_delta"),
        ("content_block_delta", 0, "signature_delta"), ("content_block_stop", 0, None),
        ("content_block_stop", 1, None), ("content_block_stop", 2, None),
        ("message_delta", None, None), ("message_stop", None, None),
    ]
    assert all(data["type"] == name for name, data in events)
    start = events[0][1]["message"]
    assert start["content"] == [] and start["usage"] == {"cache_read_input_tokens": 2, "input_tokens": 10,
                                                         "output_tokens": 0}
    assert events[-2][1] == {"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                             "usage": {"output_tokens": 9}}


def test_text_only_stream_is_one_block_at_index_zero() -> None:
    stream = anthropic.MessageStream("chatcmpl-1", "m")
    events = stream.start(3, 0) + stream.delta(text="a") + stream.delta(text="") + stream.close("end_turn", "END", 1)
    assert [(n, d.get("index")) for n, d in events] == [
        ("message_start", None), ("content_block_start", 0), ("content_block_delta", 0), ("content_block_stop", 0),
        ("message_delta", None), ("message_stop", None)]
    assert events[-2][1]["delta"]["stop_sequence"] == "END"
