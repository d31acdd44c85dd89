"""llama-server's checks of a chat request's `messages` (server-common.cpp's oaicompat_chat_params_parse and
common/chat.cpp's common_chat_msgs_parse_oaicompat, build 0c1e570), in its order and with its messages.

Every one is a std::invalid_argument there, so a 400 invalid_request_error here.
"""

from __future__ import annotations

from fake_engines.llamacpp.errors import LlamaError
from fake_engines.llamacpp.media import check_message_media


def check_chat_body(body: dict, prefill_assistant: bool = True) -> None:
    """Raise the LlamaError llama-server answers for malformed `messages` or a contradictory
    continue_final_message; `body["messages"]` is known to be a list."""
    messages = body["messages"]
    for msg in messages:
        _check_content_present(msg)
        check_message_media(msg)  # the same loop loads media in llama-server: no projector here
    for msg in messages:
        _check_parsed(msg)
    continuation = _continuation(body.get("continue_final_message"))
    add_generation_prompt = body.get("add_generation_prompt", True)
    if not continuation and prefill_assistant and messages and messages[-1].get("role") == "assistant":
        if len(messages) >= 2 and messages[-2].get("role") == "assistant":
            raise LlamaError(400, "Cannot have 2 or more assistant messages at the end of the list.")
        continuation, add_generation_prompt = True, False
    if continuation and add_generation_prompt:
        raise LlamaError(400, "Cannot set both add_generation_prompt and continue_final_message to true.")


def _check_content_present(msg: object) -> None:
    fields = msg if isinstance(msg, dict) else {}
    role = fields.get("role") if isinstance(fields.get("role"), str) else ""  # json_value: wrong type -> default
    if role != "assistant" and "content" not in fields:
        raise LlamaError(400, "All non-assistant messages must contain 'content'")
    if role == "assistant" and "content" not in fields and "tool_calls" not in fields:
        raise LlamaError(400, "Assistant message must contain either 'content' or 'tool_calls'!")
    content = fields.get("content")
    if "content" in fields and content is not None and not isinstance(content, str | list):
        raise LlamaError(400, "Expected 'content' to be a string or an array")


def _check_parsed(msg: object) -> None:
    if not isinstance(msg, dict):
        raise LlamaError(400, f"Expected 'message' to be an object, got {_dump(msg)}")
    if "role" not in msg:
        raise LlamaError(400, f"Missing 'role' in message: {_dump(msg)}")
    content = msg.get("content")
    for part in content if isinstance(content, list) else []:
        if not isinstance(part, dict) or "type" not in part:
            raise LlamaError(400, f"Missing content part type: {_dump(part)}")


def _continuation(value: object) -> bool:
    """common_chat_continuation_parse: true, "content" or "reasoning_content" ask to continue."""
    return value is True or value in ("content", "reasoning_content")


def _dump(value: object) -> str:
    import json

    return json.dumps(value, separators=(",", ":"))
