"""Read `usage` (prompt and cached tokens) from the tail of a response, streamed or not (pure)."""

from __future__ import annotations

import json
import re
from typing import Any

import msgspec

TAIL_BYTES = 8192
"""How much of a response's end is kept: the usage chunk is the last event before [DONE]."""


class Usage(msgspec.Struct, frozen=True):
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
    if isinstance(obj, dict) and obj.get("type") == "message_start":  # Anthropic: the prompt's usage
        obj = obj.get("message")
    if not isinstance(obj, dict) or not isinstance(obj.get("usage"), dict):
        return None
    usage = obj["usage"]
    if "input_tokens" in usage:
        return _anthropic_usage(usage)
    prompt = usage.get("prompt_tokens")
    if not isinstance(prompt, int):
        return None
    details = usage.get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    if not isinstance(cached, int):  # llama-server reports its cache reuse in `timings`
        timings = obj.get("timings")
        cached = timings.get("cache_n") if isinstance(timings, dict) else None
    said = isinstance(cached, int)
    return Usage(prompt_tokens=prompt, cached_tokens=cached if isinstance(cached, int) else 0, reports_cache=said)


def _anthropic_usage(usage: dict) -> Usage | None:
    """Anthropic's usage (a message, or a stream's message_start): input_tokens counts only the prompt
    tokens neither read from nor written to the cache."""
    counts = [usage.get(k, 0) for k in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")]
    if not all(isinstance(n, int) and not isinstance(n, bool) for n in counts):
        return None
    return Usage(prompt_tokens=sum(counts), cached_tokens=counts[1], reports_cache="cache_read_input_tokens" in usage)


class _UsageFields(msgspec.Struct):
    """The members of an answer (or event) that carry its usage; msgspec skips the rest (the
    choices, the text) without building them: a seventh of decoding the whole answer."""

    type: Any = None
    message: Any = None
    usage: Any = None
    timings: Any = None


_usage_fields = msgspec.json.Decoder(_UsageFields)


class _PromptDetails(msgspec.Struct):
    cached_tokens: int | None = None


class _OpenAIUsage(msgspec.Struct):
    prompt_tokens: int
    prompt_tokens_details: _PromptDetails | None = None
    input_tokens: msgspec.UnsetType = msgspec.UNSET
    """Absent: a usage that names it is read as Anthropic's, by `_usage_of`."""


class _OpenAIAnswer(msgspec.Struct):
    """The usual answer, typed: OpenAI's usage, llama-server's timings. Anything else (Anthropic,
    a member of another type) fails validation and is read by `_usage_of`."""

    usage: _OpenAIUsage
    timings: Any = None
    type: None = None
    message: None = None


_openai_answer = msgspec.json.Decoder(_OpenAIAnswer)


def usage_from_json(body: bytes) -> Usage | None:
    try:  # typed, the common case: no dict built for usage, half the cost of the general reading
        return _openai_usage(_openai_answer.decode(body))
    except msgspec.MsgspecError:
        pass
    try:
        return _usage_of(msgspec.structs.asdict(_usage_fields.decode(body)))
    except msgspec.MsgspecError:
        pass
    try:
        return _usage_of(json.loads(body))  # what msgspec refuses (NaN, a BOM) json may still read
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None


def _openai_usage(answer: _OpenAIAnswer) -> Usage:
    """`_usage_of` for an answer that passed the typed decoder."""
    details = answer.usage.prompt_tokens_details
    cached = details.cached_tokens if details is not None else None
    if cached is None:  # llama-server reports its cache reuse in `timings`
        timings = answer.timings
        found = timings.get("cache_n") if isinstance(timings, dict) else None
        cached = found if isinstance(found, int) else None
    return Usage(prompt_tokens=answer.usage.prompt_tokens, cached_tokens=cached if cached is not None else 0,
                 reports_cache=cached is not None)


def usage_from_sse_tail(tail: bytes) -> Usage | None:
    """The newest `usage` in the last events of a stream; None when the stream carried none."""
    for event in reversed(split_events(tail)):
        if b'"usage"' not in event:
            continue
        found = usage_from_json(event_data(event))
        if found is not None:
            return found
    return None


USAGE_OBJECT = re.compile(rb'"usage"\s*:\s*\{')
EVENT_END = re.compile(rb"(?:\r\n|\r|\n)(?:\r\n|\r|\n)")
"""A blank line: the end of an event (SSE lines end in CRLF, LF or CR)."""
LINE_END = re.compile(rb"\r\n|\r|\n")


def split_events(data: bytes) -> list[bytes]:
    """The events of a stream (each with its ending blank line), the unfinished rest last."""
    events, start = [], 0
    for m in EVENT_END.finditer(data):
        events.append(data[start:m.end()])
        start = m.end()
    if start < len(data):
        events.append(data[start:])
    return events


def event_data(event: bytes) -> bytes:
    """The event's `data` lines joined by newlines (the field value an SSE client sees)."""
    values = []
    for line in LINE_END.split(event):
        if line.startswith(b"data:"):
            value = line[5:]
            values.append(value[1:] if value.startswith(b" ") else value)
    return b"\n".join(values)


def is_usage_only_event(event: bytes) -> bool:
    """A `choices: []` chunk that carries only `usage` (the one the proxy asks for)."""
    if not USAGE_OBJECT.search(event):
        return False
    lines = [line for line in LINE_END.split(event) if line]
    if not lines or not all(line.startswith(b"data:") for line in lines):
        return False
    try:
        obj = json.loads(event_data(event))
    except (ValueError, UnicodeDecodeError):
        return False
    return isinstance(obj, dict) and obj.get("choices") == [] and isinstance(obj.get("usage"), dict)


MAX_PENDING_BYTES = 1 << 20
"""Longest unfinished event held back; usage events are a few hundred bytes."""


class UsageEventFilter:
    """Takes the usage-only events out of an event stream, whatever the chunking.

    The proxy asks for usage on streams whose client did not, to learn each backend's prefill
    work; this takes that extra event out again so the client gets the stream it asked for. An
    event may arrive split across reads, so the unfinished end of each chunk waits for the rest;
    whole events pass through at once, byte for byte.
    """

    def __init__(self) -> None:
        self.pending = b""
        """The start of an event whose end has not arrived yet."""

    def feed(self, chunk: bytes) -> bytes:
        data = self.pending + chunk if self.pending else chunk
        # A body that never ends an event is not SSE after all: pass it on rather than hold it.
        cut = _last_event_end(data) if len(data) <= MAX_PENDING_BYTES else len(data)
        self.pending = data[cut:]
        whole = data[:cut]
        if not USAGE_OBJECT.search(whole):
            return whole
        return b"".join(e for e in split_events(whole) if not is_usage_only_event(e))

    def flush(self) -> bytes:
        """What is left at the end of the stream (an unfinished last event, passed on as is)."""
        rest, self.pending = self.pending, b""
        return rest


EVENT_ENDS = (b"\n\n", b"\r\n\r\n", b"\r\r", b"\n\r\n", b"\r\n\n", b"\r\r\n")
"""Every way a blank line can end an event, as `EVENT_END` matches them."""


def _last_event_end(data: bytes) -> int:
    """Offset just past the last complete event in `data` (0 when there is none)."""
    return max((at + len(sep) for sep in EVENT_ENDS if (at := data.rfind(sep)) >= 0), default=0)
