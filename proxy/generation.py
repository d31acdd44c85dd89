"""A generation request read into what to forward (`Forward`): the one reading of completions,
chat and Anthropic messages that the aiohttp handlers (proxy/app.py) and the fast path
(proxy/fastpath.py) share. Compiled with the rest of the request path (proxy/build.py)."""

from __future__ import annotations

import json
from collections.abc import Mapping

import msgspec

from policies.routing.base import RoutingPolicy
from policies.routing.kv_index import KVIndexUser
from proxy.config import ProxyConfig
from proxy.engine_tokens import engine_anthropic_prompt_ids, engine_prompt_ids
from proxy.errors import ProxyError
from proxy.pool import BackendPool
from proxy.records import Forward
from proxy.request_parse import parse_anthropic_request, parse_request


def generation_forward(pool: BackendPool, config: ProxyConfig, policy: RoutingPolicy, raw: bytes, body: dict,
                       headers: Mapping[str, str], path_qs: str, chat: bool, anthropic: bool = False,
                       generates: bool = True) -> Forward:
    """What to forward for a generation request, from its parsed body (ProxyError for bad input);
    the one reading of a request that both the aiohttp handlers and the fast path use."""
    # Parsing asks only whether the model is an adapter: name it alone, not every adapter's union.
    named = body.get("model")
    adapters = frozenset((named,)) if isinstance(named, str) and pool.has_adapter(named) else frozenset()
    if anthropic:
        parsed = parse_anthropic_request(body, headers, config.session_header, config.chars_per_token, adapters)
    else:
        parsed = parse_request(body, chat, headers, config.session_header, config.chars_per_token, adapters)
    if isinstance(policy, KVIndexUser):  # the KV index is keyed by the engine's own token ids
        ids = engine_anthropic_prompt_ids(body) if anthropic else engine_prompt_ids(body, chat)
        if ids:
            info = msgspec.structs.replace(parsed.info, prompt_token_ids=ids, prompt_tokens=len(ids))
            parsed = msgspec.structs.replace(parsed, info=info)
    model = parsed.info.model
    if model is not None and pool.is_unknown_model(model):
        raise ProxyError(404, f"The model `{model}` does not exist.", param="model", code="model_not_found")
    # Anthropic streams carry their usage in message_start: there is no stream_options to ask with
    strip_usage = not anthropic and config.stream_usage and parsed.stream and not _asks_usage(body)
    if strip_usage:
        raw = with_usage_asked(raw, body)
    return Forward(method="POST", path_qs=path_qs, body=raw, info=parsed.info,
                   debug=headers.get("x-flotilla-debug") == "1", accounts_usage=generates, strip_usage=strip_usage)


def with_usage_asked(raw: bytes, body: dict) -> bytes:
    """The body with stream_options.include_usage set. Without stream_options the member is
    spliced in before the closing brace (a long prompt is not serialised again); else the
    parsed body is."""
    end = len(raw.rstrip()) - 1  # a JSON object: its last non-space byte closes it
    if "stream_options" not in body and raw[end - 1:end + 1] not in (b"\x00}", b"}\x00"):  # UTF-8, not 16/32
        return raw[:end] + (b"," if body else b"") + b'"stream_options":{"include_usage":true}' + raw[end:]
    body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
    return json.dumps(body).encode()


def _asks_usage(body: dict) -> bool:
    options = body.get("stream_options")
    return isinstance(options, dict) and bool(options.get("include_usage"))
