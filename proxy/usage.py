"""Read `usage` (prompt and cached tokens) from the tail of a response, streamed or not (pure)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

TAIL_BYTES = 8192
"""How much of a response's end is kept: the usage chunk is the last event before [DONE]."""


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    cached_tokens: int
    """Prompt tokens the engine served from its prefix cache (0 when it does not say)."""
    reports_cache: bool = False
    """The engine said how many prompt tokens it served from cache (vLLM with
    --enable-prompt-tokens-details, llama-server's timings)."""

    @property
    def prefill_tokens(self) -> int:
        return max(0, self.prompt_tokens - self.cached_tokens)


def _usage_of(obj: object) -> Usage | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("usage"), dict):
        return None
    usage = obj["usage"]
    prompt = usage.get("prompt_tokens")
    if not isinstance(prompt, int):
        return None
    details = usage.get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    if not isinstance(cached, int):  # llama-server reports its cache reuse in `timings`
        timings = obj.get("timings")
        cached = timings.get("cache_n") if isinstance(timings, dict) else None
    said = isinstance(cached, int)
    return Usage(prompt_tokens=prompt, cached_tokens=cached if said else 0, reports_cache=said)


def usage_from_json(body: bytes) -> Usage | None:
    try:
        return _usage_of(json.loads(body))
    except (ValueError, UnicodeDecodeError):
        return None


def usage_from_sse_tail(tail: bytes) -> Usage | None:
    """The newest `usage` in the last events of a stream; None when the stream carried none."""
    for event in reversed(tail.split(b"\n\n")):
        line = event.strip()
        if not line.startswith(b"data:") or b'"usage"' not in line:
            continue
        found = usage_from_json(line[5:])
        if found is not None:
            return found
    return None


USAGE_OBJECT = re.compile(rb'"usage"\s*:\s*\{')


def _is_usage_only_event(event: bytes) -> bool:
    if not event.startswith(b"data:") or not USAGE_OBJECT.search(event):
        return False
    try:
        obj = json.loads(event[5:])
    except (ValueError, UnicodeDecodeError):
        return False
    return isinstance(obj, dict) and obj.get("choices") == [] and isinstance(obj.get("usage"), dict)


def drop_usage_events(chunk: bytes) -> bytes:
    """Remove the usage-only events (`choices: []`) from a chunk of an event stream.

    The proxy asks for usage on streams whose client did not, to learn each backend's prefill
    work; this takes that extra event out again so the client gets the stream it asked for.
    """
    if not USAGE_OBJECT.search(chunk):
        return chunk
    return b"\n\n".join(e for e in chunk.split(b"\n\n") if not _is_usage_only_event(e))
