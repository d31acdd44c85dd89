"""A small in-process OpenAI-compatible SSE server on a real 127.0.0.1 socket.

It streams one chunk per token, reports usage (with cached_tokens from a toy prefix cache of
16-token blocks), names itself in x-flotilla-backend and logs when each request arrived, so
tests can check the client's timings and the open loop against what the server saw.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import subprocess
import sys
import time
from dataclasses import dataclass, field

import pytest
from aiohttp import web

from loadgen.prompts import CHARS_PER_TOKEN, token_count

CACHE_BLOCK_CHARS = 16 * CHARS_PER_TOKEN


@dataclass
class SseServerState:
    """Knobs and logs of the test server."""

    token_delay_s: float = 0.0
    """Wait before each streamed token, seconds."""
    backend: str = "replica-0"
    """Name sent in x-flotilla-backend."""
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
    state.arrivals_s.append(time.perf_counter())
    try:
        body = await request.json()
        prompt = body["prompt"]
        max_tokens = int(body["max_tokens"])
    except (ValueError, KeyError, TypeError):
        return _error(400, "expected JSON with prompt and max_tokens")
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "x-flotilla-backend": state.backend})
    await resp.prepare(request)
    for _ in range(max_tokens):
        if state.token_delay_s:
            await asyncio.sleep(state.token_delay_s)
        chunk = {"object": "text_completion", "choices": [{"index": 0, "text": "tok ", "finish_reason": None}], "usage": None}
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


@pytest.fixture
async def sse_server(aiohttp_server):
    """(base_url, state) of a running in-process test server; set state.token_delay_s to slow it."""
    state = SseServerState()
    server = await aiohttp_server(make_app(state), host="127.0.0.1")
    return f"http://127.0.0.1:{server.port}", state


@pytest.fixture
def slow_sse_server_process(repo_root):
    """Base URL of the test server in its own process, streaming one token per 0.1 s."""
    proc = subprocess.Popen([sys.executable, "-m", "tests.loadgen.sse_server", "--token-delay-s", "0.1"],
                            cwd=repo_root, stdout=subprocess.PIPE, text=True)
    try:
        port = int(proc.stdout.readline())
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
