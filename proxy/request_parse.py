"""Parse only what routing needs from an OpenAI request body, and reject bad input early."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass

from policies.routing.base import RequestInfo
from proxy.errors import ProxyError

JSON_TYPES = ("application/json",)


@dataclass(frozen=True)
class ParsedRequest:
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
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProxyError(400, f"The request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ProxyError(400, "The request body must be a JSON object.")
    return body


def _content_text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # multimodal parts: only the text parts reach the prefix cache
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def render_chat(messages: object) -> str:
    """Every message in order, as the engine's template would see them (roles and contents)."""
    if not isinstance(messages, list) or not messages:
        raise ProxyError(400, "'messages' must be a non-empty array.", param="messages")
    parts = []
    for m in messages:
        if not isinstance(m, dict) or "role" not in m:
            raise ProxyError(400, "Each message must be an object with a 'role'.", param="messages")
        parts.append(f"<|{m['role']}|>{_content_text(m.get('content'))}")
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


def _max_tokens(body: Mapping) -> int | None:
    value = body.get("max_completion_tokens", body.get("max_tokens"))
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ProxyError(400, f"'max_tokens' must be a positive integer, got {value!r}.", param="max_tokens")
    return value


def parse_request(body: dict, chat: bool, headers: Mapping[str, str], session_header: str,
                  chars_per_token: float, adapters: frozenset[str] = frozenset()) -> ParsedRequest:
    """Validate a completions or chat body and build the routing view of it."""
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise ProxyError(400, "'model' must be a string.", param="model")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ProxyError(400, "'stream' must be a boolean.", param="stream")
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
