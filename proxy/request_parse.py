"""Parse only what routing needs from an OpenAI request body, and reject bad input early."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping

import msgspec

from policies.routing.base import RequestInfo
from proxy.errors import ProxyError

JSON_TYPES = ("application/json",)
MAX_JSON_DEPTH = 64
"""Arrays and objects nested deeper than this are refused (no OpenAI field needs more, and the
engines parse the same body again)."""
SHORT_BODY_BYTES = 16 * 1024
"""Bodies up to this long are counted for brackets before their tree is walked (longer ones are
walked at once: counting a long prompt costs more than walking its few members)."""


class ParsedRequest(msgspec.Struct, frozen=True):
    """A validated request: the body to forward as is, and the routing view of it."""

    info: RequestInfo
    stream: bool
    """The client asked for server-sent events."""


def check_content_type(content_type: str) -> None:
    ctype = content_type.split(";", 1)[0].strip().lower()
    if ctype and ctype not in JSON_TYPES and not ctype.endswith("+json"):
        raise ProxyError(415, f"Unsupported content type {ctype!r}: send application/json.")


def load_json_object(raw: bytes) -> dict:
    if not raw.strip():
        raise ProxyError(400, "The request body is empty; a JSON object is required.")
    try:
        # msgspec parses a long prompt in about half json's time, to the same values; whatever
        # it refuses (NaN, 1e400, a BOM, a lone surrogate, bad JSON) goes to json as before.
        body = msgspec.json.decode(raw)
        # No non-finite number gets past msgspec, so only nesting is left to check, and a short
        # body with fewer brackets than the limit cannot nest that deep: no walk over it.
        walk = len(raw) > SHORT_BODY_BYTES or raw.count(b"{") + raw.count(b"[") >= MAX_JSON_DEPTH
    except (msgspec.MsgspecError, RecursionError):
        body, walk = _json_loads(raw), True
    if not isinstance(body, dict):
        raise ProxyError(400, "The request body must be a JSON object.")
    if walk:
        check_json_tree(body)
    return body


def _json_loads(raw: bytes) -> object:
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProxyError(400, f"The request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise ProxyError(400, f"The request body nests arrays or objects deeper than {MAX_JSON_DEPTH} levels.") \
            from None


def check_json_tree(value: object) -> None:
    """400 for nesting deeper than MAX_JSON_DEPTH and for non-finite numbers (`1e400` parses as
    infinity, `NaN` is no JSON at all), naming where the first one is. Iterative: no recursion to
    exhaust."""
    stack: list[tuple[object, str, int]] = [(value, "", 0)]
    while stack:
        item, path, depth = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            raise ProxyError(400, f"'{path}' must be a finite number.", param=path or None)
        if not isinstance(item, (dict, list)):
            continue
        if depth >= MAX_JSON_DEPTH:
            raise ProxyError(400, f"The request body nests arrays or objects deeper than {MAX_JSON_DEPTH} levels.",
                             param=path or None)
        children = item.items() if isinstance(item, dict) else enumerate(item)
        for key, child in children:
            if isinstance(child, (dict, list, float)):
                stack.append((child, _child_path(path, key), depth + 1))


def _child_path(path: str, key: object) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else str(key)


def _content_text(content: object, where: str) -> str:
    """A message's text: a string, null (an assistant turn with tool calls only), or an array of
    parts whose text parts reach the prefix cache."""
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise ProxyError(400, f"'{where}' must be a string, an array of content parts or null.", param=where)
    texts = []
    for j, part in enumerate(content):
        if not isinstance(part, dict):
            raise ProxyError(400, f"'{where}[{j}]' must be an object.", param=f"{where}[{j}]")
        if "text" in part:
            if not isinstance(part["text"], str):
                raise ProxyError(400, f"'{where}[{j}].text' must be a string.", param=f"{where}[{j}].text")
            texts.append(part["text"])
    return "".join(texts)


def render_chat(messages: object) -> str:
    """Every message in order, as the engine's template would see them (roles and contents)."""
    if not isinstance(messages, list) or not messages:
        raise ProxyError(400, "'messages' must be a non-empty array.", param="messages")
    parts = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m:
            raise ProxyError(400, "Each message must be an object with a 'role'.", param="messages")
        if not isinstance(m["role"], str):
            raise ProxyError(400, f"'messages[{i}].role' must be a string.", param=f"messages[{i}].role")
        parts.append(f"<|{m['role']}|>{_content_text(m.get('content'), f'messages[{i}].content')}")
    return "\n".join(parts)


def _prompt(prompt: object) -> tuple[str | None, tuple[int, ...] | None]:
    if isinstance(prompt, str):
        return prompt, None
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        return "\n".join(prompt), None
    if isinstance(prompt, list) and prompt and all(isinstance(p, int) for p in prompt):
        return None, tuple(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(p, list) for p in prompt):
        return None, tuple(t for p in prompt for t in p if isinstance(t, int))
    raise ProxyError(400, "'prompt' must be a string, an array of strings or of token ids.", param="prompt")


MAX_TOKENS_LIMIT = 2**31 - 1
"""Largest max_tokens taken (no engine has a context near it; bigger ints overflow float maths)."""


def _max_tokens(body: Mapping) -> int | None:
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_TOKENS_LIMIT:
        raise ProxyError(400, f"'{name}' must be a positive integer up to {MAX_TOKENS_LIMIT}, got {value!r}.",
                         param=name)
    return value


def _check_stream_options(options: object) -> None:
    if options is None:
        return
    if not isinstance(options, dict):
        raise ProxyError(400, "'stream_options' must be an object.", param="stream_options")
    if not isinstance(options.get("include_usage", False), bool):
        raise ProxyError(400, "'stream_options.include_usage' must be a boolean.",
                         param="stream_options.include_usage")


def parse_request(body: dict, chat: bool, headers: Mapping[str, str], session_header: str,
                  chars_per_token: float, adapters: frozenset[str] = frozenset()) -> ParsedRequest:
    """Validate a completions or chat body and build the routing view of it."""
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise ProxyError(400, "'model' must be a string.", param="model")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ProxyError(400, "'stream' must be a boolean.", param="stream")
    _check_stream_options(body.get("stream_options"))
    text: str | None
    ids: tuple[int, ...] | None
    if chat:
        text, ids = render_chat(body.get("messages")), None
    elif "prompt" not in body:
        raise ProxyError(400, "'prompt' is required.", param="prompt")
    else:
        text, ids = _prompt(body["prompt"])
    max_tokens = _max_tokens(body)
    prompt_tokens = len(ids) if ids is not None else math.ceil(len(text or "") / chars_per_token)
    user = body.get("user")
    session = headers.get(session_header) or (user if isinstance(user, str) else None)
    info = RequestInfo(
        model=model, prompt=text, prompt_token_ids=ids, session_key=session,
        lora=model if model in adapters else None, prompt_tokens=prompt_tokens, max_tokens=max_tokens,
        headers=headers, request_id=headers.get("x-request-id"),
    )
    return ParsedRequest(info=info, stream=stream)



def parse_anthropic_request(body: dict, headers: Mapping[str, str], session_header: str,
                            chars_per_token: float, adapters: frozenset[str] = frozenset()) -> ParsedRequest:
    """Validate an Anthropic Messages body (/v1/messages, /v1/messages/count_tokens) and build the
    routing view of it: the system prompt (a string or text blocks) rendered before the messages,
    whose text blocks reach the prefix cache; metadata.user_id keys the session like OpenAI's `user`."""
    if "messages" not in body:
        raise ProxyError(400, "'messages' is required.", param="messages")
    system = _system_text(body.get("system"))
    metadata = body.get("metadata")
    user = metadata.get("user_id") if isinstance(metadata, dict) else None
    parsed = parse_request({**body, "user": user}, True, headers, session_header, chars_per_token, adapters)
    if not system:
        return parsed
    prompt = f"<|system|>{system}\n{parsed.info.prompt}"
    info = msgspec.structs.replace(parsed.info, prompt=prompt, prompt_tokens=math.ceil(len(prompt) / chars_per_token))
    return msgspec.structs.replace(parsed, info=info)


def _system_text(system: object) -> str:
    if system is None or isinstance(system, str):
        return system or ""
    if not isinstance(system, list):
        raise ProxyError(400, "'system' must be a string or an array of text blocks.", param="system")
    return _content_text(system, "system")
