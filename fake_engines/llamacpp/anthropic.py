"""Anthropic's Messages API as llama-server implements it (build 0c1e570): the request converted to a chat
completion body (server-chat.cpp's server_chat_convert_anthropic_to_oai) and the answer shaped as a
message (server-task.cpp's to_json_anthropic*). Pure: no I/O, no clock.

A streamed answer is a list of `(event name, data)` pairs; the route writes each as
`event: <name>` then `data: <json>`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from fake_engines.llamacpp.errors import LlamaError

Event = tuple[str, dict]
"""One server-sent event: its `event:` name and its `data:` object."""

DEFAULT_MAX_TOKENS = 4096
"""max_tokens when the request has none (Anthropic requires it; llama-server does not)."""

_PASSED_THROUGH = ("temperature", "top_p", "top_k", "stream", "chat_template_kwargs")
_BILLING_HEADER = "x-anthropic-billing-header:"


def to_chat_body(body: dict) -> dict:
    """The chat completion body llama-server builds from an Anthropic request. Everything it does not
    convert (model, metadata other than user_id, unknown fields) is dropped, as there."""
    messages = _system(body.get("system"))
    if "messages" not in body:
        raise LlamaError(500, "'messages' is required")  # a std::runtime_error there: 500
    if isinstance(body["messages"], list):
        for msg in body["messages"]:
            messages += _message(msg)
    chat: dict = {"messages": messages}
    if isinstance(body.get("tools"), list):
        chat["tools"] = [_tool(t) for t in body["tools"]]
    choice = _tool_choice(body.get("tool_choice"))
    if choice is not None:
        chat["tool_choice"] = choice
    if "stop_sequences" in body:
        chat["stop"] = body["stop_sequences"]
    chat["max_tokens"] = body.get("max_tokens", DEFAULT_MAX_TOKENS)
    chat.update({k: body[k] for k in _PASSED_THROUGH if k in body})
    chat.update(_thinking_and_metadata(body))
    return chat


def _system(system: object) -> list[dict]:
    if isinstance(system, str):
        return [{"role": "system", "content": normalize_billing_header(system)}]
    if isinstance(system, list):
        text = "".join(normalize_billing_header(_str(b, "text")) for b in system
                       if isinstance(b, dict) and b.get("type") == "text")
        return [{"role": "system", "content": text}]
    return [] if system is None else [{"role": "system", "content": ""}]


def normalize_billing_header(text: str) -> str:
    """Claude Code's system prompt starts with a billing header whose `cch=` stamp changes per request and
    would defeat prefix caching: llama-server overwrites those five characters with `f`."""
    if not text.startswith(_BILLING_HEADER):
        return text
    at = text.find("cch=", len(_BILLING_HEADER))
    start = at + 4
    if at < 0 or start + 5 >= len(text) or text[start + 5] != ";":
        return text
    return text[:start] + "fffff" + text[start + 5:]


def _message(msg: object) -> list[dict]:
    """One Anthropic message as chat messages: text/image/tool_use/thinking in one, then one `tool`
    message per tool_result. Messages it cannot read pass through for the chat checks to judge."""
    if not isinstance(msg, dict):
        return [msg]  # type: ignore[list-item]  # the chat checks answer "Expected 'message' to be an object"
    role = msg.get("role") if isinstance(msg.get("role"), str) else ""
    if "content" not in msg:
        return [] if role == "assistant" else [msg]
    if not isinstance(msg["content"], list):
        return [msg]
    content: list[dict] = []
    tool_calls: list[dict] = []
    tool_results: list[dict] = []
    reasoning = ""
    for block in msg["content"]:
        kind = _str(block, "type")
        if kind == "text":
            content.append(block)
        elif kind == "thinking":
            reasoning += _str(block, "thinking")
        elif kind == "image":
            content += _image(block)
        elif kind == "tool_use":
            tool_calls.append(_tool_call(block))
        elif kind == "tool_result":
            tool_results.append(_tool_result(block))
    out: list[dict] = []
    if content or tool_calls or reasoning:
        new: dict = {"role": role, "content": content or ""}
        if tool_calls:
            new["tool_calls"] = tool_calls
        if reasoning:
            new["reasoning_content"] = reasoning
        out.append(new)
    return out + tool_results


def _image(block: dict) -> list[dict]:
    source = block.get("source")
    url = _image_url(source if isinstance(source, dict) else {})
    return [] if url is None else [{"type": "image_url", "image_url": {"url": url}}]


def _image_url(source: dict) -> str | None:
    if source.get("type") == "base64":
        return f"data:{_str(source, 'media_type', 'image/jpeg')};base64,{_str(source, 'data')}"
    if source.get("type") == "url":
        return _str(source, "url")
    return None


def _tool_call(block: dict) -> dict:
    arguments = block.get("input") if isinstance(block.get("input"), dict) else {}
    return {"id": _str(block, "id"), "type": "function",
            "function": {"name": _str(block, "name"), "arguments": json.dumps(arguments, separators=(",", ":"))}}


def _tool_result(block: dict) -> dict:
    """A `tool` message: string content as is, text-only lists joined, lists with images as parts."""
    result: dict = {"role": "tool", "tool_call_id": _str(block, "tool_use_id")}
    content = block.get("content")
    if isinstance(content, str):
        return {**result, "content": content}
    if not isinstance(content, list):
        return {**result, "content": ""}
    parts: list[dict] = []
    for item in content:
        if _str(item, "type") == "text":
            parts.append({"type": "text", "text": _str(item, "text")})
        elif _str(item, "type") == "image":
            parts += [{"type": "image_url", "image_url": {"url": url}} for url in [_image_url(
                item.get("source") if isinstance(item.get("source"), dict) else {})] if url is not None]
    has_images = any(_str(item, "type") == "image" for item in content)
    return {**result, "content": parts if has_images else "".join(p["text"] for p in parts)}


def _tool(tool: object) -> dict:
    fields = tool if isinstance(tool, dict) else {}
    schema = fields.get("input_schema", {})
    return {"type": "function", "function": {"name": _str(fields, "name"), "description": _str(fields, "description"),
                                             "parameters": schema}}


def _tool_choice(choice: object) -> str | None:
    kind = _str(choice, "type") if isinstance(choice, dict) else ""
    return "auto" if kind == "auto" else "required" if kind in ("any", "tool") else None


def _thinking_and_metadata(body: dict) -> dict:
    extra: dict = {}
    thinking = body.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") == "enabled":
        budget = thinking.get("budget_tokens", 10000)
        extra["thinking_budget_tokens"] = budget if isinstance(budget, int) else 10000
    metadata = body.get("metadata")
    if isinstance(metadata, dict) and _str(metadata, "user_id"):
        extra["__metadata_user_id"] = metadata["user_id"]
    return extra


def _str(obj: object, key: str, default: str = "") -> str:
    """nlohmann's json_value(obj, key, std::string()): the value when it is a string, else the default."""
    value = obj.get(key) if isinstance(obj, dict) else None
    return value if isinstance(value, str) else default


@dataclass(frozen=True)
class Reply:
    """What the model said, split as llama-server's chat parser splits it."""

    text: str = ""
    """Content."""
    reasoning: str = ""
    """reasoning_content (a thinking block)."""
    tool_calls: tuple[dict, ...] = ()
    """{"id", "name", "arguments" (a JSON string)} each."""


def stop_reason(finish_reason: str, reply: Reply) -> str:
    """end_turn (tool_use when it called tools) for an end of generation or a stop string; max_tokens for
    the length limit."""
    if finish_reason == "length":
        return "max_tokens"
    return "tool_use" if reply.tool_calls else "end_turn"


def usage(n_prompt: int, n_cached: int, n_decoded: int) -> dict:
    """Anthropic usage: input_tokens counts only the prompt tokens not read from the cache."""
    return {"cache_read_input_tokens": n_cached, "input_tokens": n_prompt - n_cached, "output_tokens": n_decoded}


def message_body(rid: str, model: str, reply: Reply, reason: str, stop_sequence: str, use: dict) -> dict:
    """The non-streamed answer: thinking, text, then tool_use blocks; no `timings`."""
    return {"id": rid, "type": "message", "role": "assistant", "content": _blocks(reply), "model": model,
            "stop_reason": reason, "stop_sequence": stop_sequence or None, "usage": use}


def _blocks(reply: Reply) -> list[dict]:
    blocks: list[dict] = []
    if reply.reasoning:
        blocks.append({"type": "thinking", "thinking": reply.reasoning, "signature": ""})
    if reply.text:
        blocks.append({"type": "text", "text": reply.text})
    return blocks + [{"type": "tool_use", "id": c["id"], "name": c["name"], "input": _arguments(c["arguments"])}
                     for c in reply.tool_calls]


def _arguments(text: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


@dataclass
class MessageStream:
    """The event sequence of a streamed answer: message_start with the first token, a content block per
    kind of output as it first appears (thinking at 0, text next, tool_use after), the blocks closed in
    that order at the end, then message_delta and message_stop."""

    rid: str
    """The message id (chatcmpl-...)."""
    model: str
    """The model field."""
    reply: Reply = field(default_factory=Reply)
    """Everything sent so far."""
    started: bool = False
    """message_start sent."""

    def start(self, n_prompt: int, n_cached: int) -> list[Event]:
        """message_start, once."""
        if self.started:
            return []
        self.started = True
        message: dict[str, object] = {"id": self.rid, "type": "message", "role": "assistant", "content": [], "model": self.model,
                   "stop_reason": None, "stop_sequence": None, "usage": usage(n_prompt, n_cached, 0)}
        return [("message_start", {"type": "message_start", "message": message})]

    def delta(self, text: str = "", reasoning: str = "", tool_call: dict | None = None) -> list[Event]:
        """Events for new output; `tool_call` is a whole new call {"id", "name", "arguments"}."""
        events: list[Event] = []
        if reasoning:
            if not self.reply.reasoning:
                events.append(_block_start(0, {"type": "thinking", "thinking": ""}))
            events.append(_block_delta(0, {"type": "thinking_delta", "thinking": reasoning}))
        if text:
            if not self.reply.text:
                events.append(_block_start(self._text_index(reasoning), {"type": "text", "text": ""}))
            events.append(_block_delta(self._text_index(reasoning), {"type": "text_delta", "text": text}))
        self.reply = Reply(self.reply.text + text, self.reply.reasoning + reasoning, self.reply.tool_calls)
        if tool_call is not None:
            index = self._text_index("") + bool(self.reply.text) + len(self.reply.tool_calls)
            events.append(_block_start(index, {"type": "tool_use", "id": tool_call["id"], "name": tool_call["name"]}))
            if tool_call["arguments"]:
                events.append(_block_delta(index, {"type": "input_json_delta", "partial_json": tool_call["arguments"]}))
            self.reply = Reply(self.reply.text, self.reply.reasoning, (*self.reply.tool_calls, tool_call))
        return events

    def _text_index(self, reasoning: str) -> int:
        return 1 if self.reply.reasoning or reasoning else 0

    def close(self, reason: str, stop_sequence: str, n_decoded: int) -> list[Event]:
        """The blocks' stops (a thinking block gets its empty signature first), message_delta, message_stop."""
        events: list[Event] = []
        index = 0
        if self.reply.reasoning:
            events += [_block_delta(0, {"type": "signature_delta", "signature": ""}), _block_stop(0)]
            index = 1
        if self.reply.text:
            events.append(_block_stop(index))
            index += 1
        events += [_block_stop(index + i) for i in range(len(self.reply.tool_calls))]
        delta = {"stop_reason": reason, "stop_sequence": stop_sequence or None}
        return [*events, ("message_delta", {"type": "message_delta", "delta": delta,
                                             "usage": {"output_tokens": n_decoded}}),
                ("message_stop", {"type": "message_stop"})]


def _block_start(index: int, block: dict) -> Event:
    return "content_block_start", {"type": "content_block_start", "index": index, "content_block": block}


def _block_delta(index: int, delta: dict) -> Event:
    return "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}


def _block_stop(index: int) -> Event:
    return "content_block_stop", {"type": "content_block_stop", "index": index}
