"""A zero-latency OpenAI-style backend: pre-encoded answers, so every measured millisecond is the
client's or the proxy's. Streams 16 one-token chunks, a usage chunk and [DONE]."""

from __future__ import annotations

import argparse
import json

from aiohttp import web

STREAM_CHUNKS = 16

_COMPLETION = json.dumps({
    "id": "cmpl-bench", "object": "text_completion", "created": 0, "model": "bench",
    "choices": [{"index": 0, "text": " hello world", "finish_reason": "length"}],
    "usage": {"prompt_tokens": 8, "completion_tokens": 2, "total_tokens": 10},
}).encode()
_CHUNK = b"data: " + json.dumps({"id": "cmpl-bench", "object": "text_completion", "created": 0, "model": "bench",
                                  "choices": [{"index": 0, "text": " tok", "finish_reason": None}]}).encode() + b"\n\n"
_TAIL = (b"data: " + json.dumps({"id": "cmpl-bench", "object": "text_completion", "created": 0, "model": "bench",
                                  "choices": [], "usage": {"prompt_tokens": 8, "completion_tokens": 16,
                                                           "total_tokens": 24}}).encode()
         + b"\n\ndata: [DONE]\n\n")


async def completions(request: web.Request) -> web.StreamResponse:
    body = await request.read()
    if b'"stream": true' not in body and b'"stream":true' not in body:
        return web.Response(body=_COMPLETION, content_type="application/json")
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for _ in range(STREAM_CHUNKS):
        await resp.write(_CHUNK)
    await resp.write(_TAIL)
    await resp.write_eof()
    return resp


async def health(request: web.Request) -> web.Response:
    return web.Response()


async def models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": "bench", "object": "model"}]})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    app = web.Application()
    app.add_routes([web.post("/v1/completions", completions), web.post("/v1/chat/completions", completions),
                    web.get("/health", health),
                    web.get("/v1/models", models)])
    try:
        import uvloop
        loop = uvloop.new_event_loop()
    except ImportError:
        loop = None
    web.run_app(app, host="127.0.0.1", port=args.port, access_log=None, print=None, loop=loop)


if __name__ == "__main__":
    main()
