"""A small OpenAI-compatible SSE server for the loadgen tests, on a real 127.0.0.1 socket.

Run in process through the `sse_server` fixture, or as its own process with
`python -m tests.loadgen.sse_server --token-delay-s 0.1` (it prints its port on the first line),
so timing tests do not share the client's event loop.

It streams one chunk per token, reports usage (with cached_tokens from a toy prefix cache of
16-token blocks), names itself in x-flotilla-backend and logs when each request arrived, so
tests can check the client's timings and the open loop against what the server saw.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import sys
import time
from dataclasses import dataclass, field

from aiohttp import web

from loadgen.prompts import CHARS_PER_TOKEN, token_count

CACHE_BLOCK_CHARS = 16 * CHARS_PER_TOKEN


@dataclass
class SseServerState:
    """Knobs and logs of the test server."""

    token_delay_s: float = 0.0
    """Wait before each streamed token, seconds."""
    tokens_per_chunk: int = 1
    """Tokens streamed per SSE chunk (more per chunk keeps long-output tests cheap)."""
    backend: str = "replica-0"
    """Name sent in x-flotilla-backend."""
    time_scales: tuple[str | None, ...] = ()
    """x-flotilla-time-scale of request i is time_scales[i % len] (None: no header); () sends none."""
    arrivals_s: list[float] = field(default_factory=list)
    """time.perf_counter() when each request arrived."""
    usages: list[dict] = field(default_factory=list)
    """Every usage object sent."""
    seen_blocks: set[str] = field(default_factory=set)
    """Digests of every cached prefix, one per 16-token block boundary."""

    def cached_tokens(self, prompt: str) -> int:
        hit = 0
        digests = []
        for end in range(CACHE_BLOCK_CHARS, len(prompt) + 1, CACHE_BLOCK_CHARS):
            digest = hashlib.sha1(prompt[:end].encode()).hexdigest()
            digests.append(digest)
            if digest in self.seen_blocks and hit == end - CACHE_BLOCK_CHARS:
                hit = end
        self.seen_blocks.update(digests)
        return hit // CHARS_PER_TOKEN


STATE: web.AppKey[SseServerState] = web.AppKey("state", SseServerState)


def _error(status: int, message: str) -> web.Response:
    body = {"error": {"message": message, "type": "BadRequestError", "param": None, "code": status}}
    return web.json_response(body, status=status)


async def _completions(request: web.Request) -> web.StreamResponse:
    state: SseServerState = request.app[STATE]
    arrival = len(state.arrivals_s)
    state.arrivals_s.append(time.perf_counter())
    try:
        body = await request.json()
        prompt = body["prompt"]
        max_tokens = int(body["max_tokens"])
    except (ValueError, KeyError, TypeError):
        return _error(400, "expected JSON with prompt and max_tokens")
    headers = {"Content-Type": "text/event-stream", "x-flotilla-backend": state.backend}
    if state.time_scales and (scale := state.time_scales[arrival % len(state.time_scales)]):
        headers["x-flotilla-time-scale"] = scale
    resp = web.StreamResponse(headers=headers)
    await resp.prepare(request)
    for first in range(0, max_tokens, state.tokens_per_chunk):
        if state.token_delay_s:
            await asyncio.sleep(state.token_delay_s)
        text = "tok " * min(state.tokens_per_chunk, max_tokens - first)
        chunk = {"object": "text_completion", "choices": [{"index": 0, "text": text, "finish_reason": None}], "usage": None}
        await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
    usage = {"prompt_tokens": token_count(prompt), "completion_tokens": max_tokens,
             "total_tokens": token_count(prompt) + max_tokens,
             "prompt_tokens_details": {"cached_tokens": state.cached_tokens(prompt)}}
    state.usages.append(usage)
    await resp.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\ndata: [DONE]\n\n".encode())
    return resp


async def _models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": "test-model", "object": "model"}]})


def make_app(state: SseServerState) -> web.Application:
    app = web.Application()
    app[STATE] = state
    app.router.add_post("/v1/completions", _completions)
    app.router.add_get("/v1/models", _models)
    return app


async def _serve(token_delay_s: float) -> None:
    runner = web.AppRunner(make_app(SseServerState(token_delay_s=token_delay_s)))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    print(runner.addresses[0][1], flush=True)
    await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--token-delay-s", type=float, default=0.0)
    asyncio.run(_serve(parser.parse_args().token_delay_s))


if __name__ == "__main__":
    sys.exit(main())
