"""One streamed OpenAI-compatible request, timed the way vLLM's benchmark_serving times it.

TTFT is from sending the request to the first chunk that carries generated text; each later
text chunk adds one inter-token latency (ITL) gap; E2E ends at the last byte of the stream;
TPOT = (E2E - TTFT) / (completion_tokens - 1) with completion_tokens from `usage`.
Token counts come from the final usage chunk (`stream_options.include_usage`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp

from loadgen.results import RequestRecord

BACKEND_HEADER = "x-flotilla-backend"


def _chunk_text(chunk: dict[str, Any]) -> str:
    """Generated text of one chunk: completions `text` or chat `delta.content`."""
    choices = chunk.get("choices") or []
    if not choices:
        return ""
    first = choices[0]
    return first.get("text") or (first.get("delta") or {}).get("content") or ""


def _apply_usage(rec: RequestRecord, usage: dict[str, Any]) -> None:
    rec.prompt_tokens = int(usage.get("prompt_tokens") or 0)
    rec.completion_tokens = int(usage.get("completion_tokens") or 0)
    details = usage.get("prompt_tokens_details") or {}
    rec.cached_tokens = int(details.get("cached_tokens") or 0)


class _StreamTimer:
    """Turns SSE lines into TTFT, ITL gaps and usage on a `RequestRecord`."""

    def __init__(self, rec: RequestRecord, clock: Callable[[], float], sent_at: float) -> None:
        self.rec, self.clock, self.sent_at = rec, clock, sent_at
        self.last_token_at: float | None = None
        self.text_chunks = 0
        self.done = False

    def feed(self, raw: bytes) -> None:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data:"):
            return  # blank separators, comments and `event:` lines carry no tokens
        data = line[5:].strip()
        if data == "[DONE]":
            self.done = True
            return
        chunk = json.loads(data)
        if chunk.get("error") or chunk.get("object") == "error":
            self._stream_error(chunk)
            return
        if chunk.get("usage"):
            _apply_usage(self.rec, chunk["usage"])
        if _chunk_text(chunk):
            self._token(self.clock())

    def _stream_error(self, chunk: dict[str, Any]) -> None:
        # vLLM reports a failure after the 200 as an error event: new builds nest it under
        # "error", older ones send {"object": "error", "message": ...}
        body: dict[str, Any] = chunk["error"] if isinstance(chunk.get("error"), dict) else chunk
        self.rec.error = f"stream error: {str(body.get('message') or body)[:200]}"

    def _token(self, now: float) -> None:
        if self.last_token_at is None:
            self.rec.ttft_s = now - self.sent_at
        else:
            self.rec.itl_s.append(now - self.last_token_at)
        self.last_token_at = now
        self.text_chunks += 1

    def finish(self, now: float) -> None:
        rec = self.rec
        rec.e2e_s = now - self.sent_at
        if rec.completion_tokens == 0:
            rec.completion_tokens = self.text_chunks  # no usage chunk: count what streamed
        if rec.ttft_s is not None and rec.completion_tokens > 1:
            rec.tpot_s = (rec.e2e_s - rec.ttft_s) / (rec.completion_tokens - 1)
        if rec.error is None and rec.ttft_s is None and rec.completion_tokens > 0:
            rec.error = "stream ended without a token"
        rec.ok = rec.error is None


async def _error_text(resp: aiohttp.ClientResponse) -> str:
    body = await resp.text()
    try:
        message = json.loads(body).get("error", {}).get("message") or body
    except (ValueError, AttributeError):
        message = body
    return f"HTTP {resp.status}: {str(message)[:200]}"


async def stream_request(session: aiohttp.ClientSession, url: str, payload: dict[str, Any],
                         rec: RequestRecord, clock: Callable[[], float],
                         on_headers: Callable[[Mapping[str, str]], None] | None = None) -> RequestRecord:
    """POST `payload` to `url`, stream the reply and fill `rec`; never raises for HTTP errors.

    `rec.send_time_s` must already be set on the `clock`'s timeline relative to the run
    start; the caller passes a clock that returns that same timeline. `on_headers` sees the
    response headers as soon as they arrive.
    """
    sent_at = rec.send_time_s
    try:
        async with session.post(url, json=payload) as resp:
            rec.backend = resp.headers.get(BACKEND_HEADER)
            if on_headers is not None:
                on_headers(resp.headers)
            if resp.status != 200:
                rec.error = await _error_text(resp)
                rec.e2e_s = clock() - sent_at
                return rec
            timer = _StreamTimer(rec, clock, sent_at)
            async for raw in resp.content:
                timer.feed(raw)
            timer.finish(clock())
    except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
        rec.ok = False
        rec.error = f"{type(exc).__name__}: {exc}"[:200]
        rec.e2e_s = clock() - sent_at
    return rec
