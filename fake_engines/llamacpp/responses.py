"""OpenAI's Responses API as llama-server implements it (build 0c1e570): the request converted to a chat
completion body (server-chat.cpp's server_chat_convert_responses_to_chatcmpl) and the answer shaped as a
response (server-task.cpp's to_json_oaicompat_resp*). Pure: no I/O; the caller passes ids and times.

Every conversion error is a std::invalid_argument there: 400 invalid_request_error here.
"""

from __future__ import annotations

import secrets
import string
from dataclasses import dataclass

from fake_engines.llamacpp.errors import LlamaError

Event = tuple[str, dict]
"""One server-sent event: its `event:` name and its `data:` object."""

_ALNUM = string.digits + string.ascii_letters


def random_id(prefix: str) -> str:
    """prefix + 32 alphanumerics, as llama-server's random_string."""
    return prefix + "".join(secrets.choice(_ALNUM) for _ in range(32))


def _bad(message: str) -> LlamaError:
    return LlamaError(400, message)


def to_chat_body(body: dict) -> dict:
    """The chat completion body: instructions as a system message, `input` as messages, function tools,
    max_output_tokens as max_tokens, reasoning.effort as reasoning_effort; other fields pass through."""
    if "input" not in body:
        raise _bad("'input' is required")
    if isinstance(body.get("previous_response_id"), str) and body["previous_response_id"]:
        raise _bad("llama.cpp does not support 'previous_response_id'.")
    chat = {k: v for k, v in body.items() if k not in ("input", "instructions", "tools", "max_output_tokens",
                                                        "reasoning")}
    messages: list[dict] = []
    if "instructions" in body:
        instructions = body["instructions"]
        messages.append({"role": "system", "content": instructions if isinstance(instructions, str) else ""})
    chat["messages"] = messages + _input_messages(body["input"], messages)
    if "tools" in body:
        tools = _tools(body["tools"])
        if tools:
            chat["tools"] = tools
    if "max_output_tokens" in body:
        chat["max_tokens"] = body["max_output_tokens"]
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict) and "effort" in reasoning:
        chat["reasoning_effort"] = reasoning["effort"]
    return chat


def _input_messages(value: object, head: list[dict]) -> list[dict]:
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list):
        raise _bad("'input' must be a string or array of objects")
    out: list[dict] = []
    for item in value:
        previous = (out or head)[-1] if out or head else None
        merge = previous is not None and previous.get("role") == "assistant"
        _add_item(dict(item) if isinstance(item, dict) else {}, out, previous if merge else None)
    return out


def _add_item(item: dict, out: list[dict], prev_assistant: dict | None) -> None:
    """One input item onto `out`; assistant output items merge into a preceding assistant message."""
    if isinstance(item.get("content"), str):
        item["content"] = [{"text": item["content"], "type": "input_text"}]
    kind, role = item.get("type"), item.get("role")
    if isinstance(item.get("content"), list) and role in ("user", "system", "developer"):
        item.pop("type", None)
        item.pop("status", None)
        out.append({**item, "content": [_input_part(p) for p in item["content"]]})
    elif role == "assistant" and kind == "message":
        _add_output_message(item, out, prev_assistant)
    elif kind == "function_call" and all(isinstance(item.get(k), str) for k in ("arguments", "call_id", "name")):
        call = {"function": {"arguments": item["arguments"], "name": item["name"]}, "id": item["call_id"],
                "type": "function"}
        if prev_assistant is not None:
            prev_assistant.setdefault("tool_calls", []).append(call)
        else:
            out.append({"role": "assistant", "tool_calls": [call]})
    elif kind == "function_call_output" and isinstance(item.get("call_id"), str) and \
            isinstance(item.get("output"), str | list):
        out.append({"content": _tool_output(item["output"]), "role": "tool", "tool_call_id": item["call_id"]})
    elif kind == "reasoning" and isinstance(item.get("summary"), list):
        _add_reasoning(item, out, prev_assistant)
    else:
        raise _bad("Cannot determine type of 'item'")


def _input_part(part: object) -> dict:
    fields = part if isinstance(part, dict) else {}
    kind = fields.get("type")
    if kind == "input_text":
        if "text" not in fields:
            raise _bad("'Input text' requires 'text'")
        return {"text": fields["text"], "type": "text"}
    if kind == "input_image":
        if "image_url" not in fields:
            raise _bad("'image_url' is required")
        return {"image_url": {"url": fields["image_url"]}, "type": "image_url"}
    if kind == "input_file":
        raise _bad("'input_file' is not supported by llamacpp at this moment")
    raise _bad("'type' must be one of 'input_text', 'input_image', or 'input_file'")


def _add_output_message(item: dict, out: list[dict], prev_assistant: dict | None) -> None:
    content = [_output_part(p) for p in item["content"]] if isinstance(item.get("content"), list) else []
    if prev_assistant is not None:
        if not isinstance(prev_assistant.get("content"), list):
            prev_assistant["content"] = []
        prev_assistant["content"] += content
        return
    out.append({**{k: v for k, v in item.items() if k not in ("status", "type")}, "content": content})


def _output_part(part: object) -> dict:
    fields = part if isinstance(part, dict) else {}
    kind = fields.get("type")
    if kind in ("output_text", "input_text"):
        if not isinstance(fields.get("text"), str):
            raise _bad("'Output text' requires 'text'")
        return {"text": fields["text"], "type": "text"}
    if kind == "refusal":
        if not isinstance(fields.get("refusal"), str):
            raise _bad("'Refusal' requires 'refusal'")
        return {"refusal": fields["refusal"], "type": "refusal"}
    raise _bad("'type' must be one of 'output_text' or 'refusal'")


def _tool_output(output: str | list) -> str | list:
    if isinstance(output, str):
        return output
    parts = []
    for part in output:
        fields = dict(part) if isinstance(part, dict) else {}
        if "type" not in fields:
            raise _bad("Output of tool call missing 'type' field")
        if fields["type"] not in ("input_text", "input_image"):
            raise _bad("Output of tool call should be 'Input text' or 'Input image'")
        if fields["type"] == "input_image":
            if "image_url" not in fields:
                raise _bad("'image_url' is required")
            fields["image_url"] = {"url": fields["image_url"]}
        fields["type"] = "text" if fields["type"] == "input_text" else "image_url"
        parts.append(fields)
    return parts


def _add_reasoning(item: dict, out: list[dict], prev_assistant: dict | None) -> None:
    content = item.get("content")
    if not isinstance(content, list):
        raise _bad("item['content'] is not an array")
    if not content:
        raise _bad("item['content'] is empty")
    if not isinstance(content[0], dict) or not isinstance(content[0].get("text"), str):
        raise _bad("item['content']['text'] is not a string")
    if prev_assistant is not None:
        prev_assistant["reasoning_content"] = content[0]["text"]
    else:
        out.append({"role": "assistant", "content": [], "reasoning_content": content[0]["text"]})


def _tools(tools: object) -> list[dict]:
    """Function tools as chat tools (strict unless said otherwise); other tool types are skipped."""
    if not isinstance(tools, list):
        raise _bad("'tools' must be an array of objects")
    out = []
    for tool in tools:
        if not isinstance(tool, dict) or tool.get("type") != "function":
            continue
        function = {k: v for k, v in tool.items() if k != "type"}
        function.setdefault("strict", True)
        out.append({"type": "function", "function": function})
    return out


@dataclass(frozen=True)
class ResponseIds:
    """The ids one response carries (drawn once per request)."""

    response: str
    """resp_..."""
    message: str
    """msg_... of the output message."""

    @staticmethod
    def new() -> ResponseIds:
        """Fresh random ids."""
        return ResponseIds(random_id("resp_"), random_id("msg_"))


def usage(n_prompt: int, n_cached: int, n_decoded: int) -> dict:
    """Responses usage."""
    return {"input_tokens": n_prompt, "output_tokens": n_decoded, "total_tokens": n_decoded + n_prompt,
            "input_tokens_details": {"cached_tokens": n_cached}}


def _text_part(text: str) -> dict:
    return {"type": "output_text", "annotations": [], "logprobs": [], "text": text}


def _message_item(message_id: str, text: str) -> dict:
    return {"content": [_text_part(text)], "id": message_id, "role": "assistant", "status": "completed",
            "type": "message"}


def response_body(ids: ResponseIds, model: str, text: str, use: dict, now: int) -> dict:
    """The non-streamed response: one output message when there is text."""
    return {"completed_at": now, "created_at": now, "id": ids.response, "model": model, "object": "response",
            "output": [_message_item(ids.message, text)] if text else [], "status": "completed", "usage": use}


def _in_progress(ids: ResponseIds, kind: str) -> Event:
    return kind, {"type": kind, "response": {"id": ids.response, "object": "response", "status": "in_progress"}}


def created_events(ids: ResponseIds) -> list[Event]:
    """response.created then response.in_progress, sent with the first token (or first progress report)."""
    return [_in_progress(ids, "response.created"), _in_progress(ids, "response.in_progress")]


def progress_event(ids: ResponseIds) -> Event:
    """A later response.in_progress (the route adds prompt_progress)."""
    return _in_progress(ids, "response.in_progress")


def text_events(ids: ResponseIds, delta: str, first: bool) -> list[Event]:
    """output_text.delta, preceded by the message item and its content part for the first text."""
    events: list[Event] = []
    if first:
        item = {"content": [], "id": ids.message, "role": "assistant", "status": "in_progress", "type": "message"}
        events += [("response.output_item.added", {"type": "response.output_item.added", "item": item}),
                   ("response.content_part.added", {"type": "response.content_part.added", "item_id": ids.message,
                                                    "part": {"type": "output_text", "text": ""}})]
    return events + [("response.output_text.delta", {"type": "response.output_text.delta", "item_id": ids.message,
                                                     "delta": delta})]


def closing_events(ids: ResponseIds, model: str, text: str, use: dict, now: int) -> list[Event]:
    """output_text.done, content_part.done, output_item.done (when there was text), response.completed."""
    output: list[dict] = []
    events: list[Event] = []
    if text:
        item = _message_item(ids.message, text)
        events = [("response.output_text.done", {"type": "response.output_text.done", "item_id": ids.message,
                                                 "text": text}),
                  ("response.content_part.done", {"type": "response.content_part.done", "item_id": ids.message,
                                                  "part": _text_part(text)}),
                  ("response.output_item.done", {"type": "response.output_item.done", "item": item})]
        output.append(item)
    response = {"id": ids.response, "object": "response", "created_at": now, "status": "completed", "model": model,
                "output": output, "usage": use}
    return [*events, ("response.completed", {"type": "response.completed", "response": response})]
