"""Routes that put another API's shape on a chat completion, as llama-server does: Anthropic's
/v1/messages and /v1/messages/count_tokens, OpenAI's /v1/responses, and the `input_tokens` counters.

Each converts its body to a chat completion body (anthropic.py, responses.py), runs it through the
chat route's parsing, rendering and slots (routes.py), and shapes the answer back.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncGenerator, Callable

from aiohttp import web

from fake_engines.driver.live import RequestHandle
from fake_engines.driver.serving import json_body, write_sse
from fake_engines.llamacpp import anthropic, responses, shapes
from fake_engines.llamacpp.app import SERVER_KEY, LlamaServer
from fake_engines.llamacpp.errors import parse_json
from fake_engines.llamacpp.progress import progress_reports
from fake_engines.llamacpp.routes import (
    SSE_HEADERS,
    LlamaRequest,
    abort_tasks,
    collect_task,
    parse_request,
    submit_all,
    task_pieces,
)
from fake_engines.llamacpp.telemetry import request_timings

Events = AsyncGenerator[tuple[str, dict], None]


async def messages(request: web.Request) -> web.StreamResponse:
    """POST /v1/messages: an Anthropic message, whole or as its event stream."""
    return await _run(request, anthropic.to_chat_body, _message_body, _message_events)


async def responses_create(request: web.Request) -> web.StreamResponse:
    """POST /v1/responses and /responses: an OpenAI response, whole or as its event stream."""
    return await _run(request, responses.to_chat_body, _response_body, _response_events)


async def count_tokens(request: web.Request) -> web.Response:
    """POST /v1/messages/count_tokens: the rendered prompt's length, {"input_tokens": n}."""
    return await _count(request, anthropic.to_chat_body, {})


async def chat_input_tokens(request: web.Request) -> web.Response:
    """POST /chat/completions/input_tokens (and /v1/...): the chat prompt's length."""
    return await _count(request, lambda body: body, {"object": "response.input_tokens"})


async def responses_input_tokens(request: web.Request) -> web.Response:
    """POST /responses/input_tokens (and /v1/...): the converted prompt's length."""
    return await _count(request, responses.to_chat_body, {"object": "response.input_tokens"})


async def _count(request: web.Request, convert: Callable[[dict], dict], extra: dict) -> web.Response:
    server = request.app[SERVER_KEY]
    req = parse_request(server, convert(parse_json(await request.read())), "chat")
    return json_body({"input_tokens": len(req.prompt_ids), **extra})


async def _run(request: web.Request, convert: Callable[[dict], dict], whole, streamed) -> web.StreamResponse:
    """Convert, queue one task, answer whole or streamed; a client gone frees the slot."""
    server = request.app[SERVER_KEY]
    body = parse_json(await request.read())
    req = parse_request(server, convert(body), "chat")
    handles = submit_all(server, req)
    abort_tasks(server, handles[1:])  # a Responses body may carry `n`: these routes answer with one task
    cancel = functools.partial(abort_tasks, server, handles[:1])
    try:
        if req.stream:
            return await write_sse(request, SSE_HEADERS, streamed(server, req, handles[0], body), cancel)
        return await whole(server, req, handles[0])
    except asyncio.CancelledError:
        cancel()
        raise


def _counts(handle: RequestHandle) -> tuple[int, int, int]:
    """Prompt tokens, of which read from the cache, tokens decoded."""
    request = handle.request
    return request.num_prompt_tokens, request.num_cached_tokens or 0, len(request.output_token_ids)


async def _message_body(server: LlamaServer, req: LlamaRequest, handle: RequestHandle) -> web.Response:
    out = await collect_task(server, req, handle)
    reply = anthropic.Reply(text=out.text)
    reason = anthropic.stop_reason(out.last.reason or "stop", reply)
    return json_body(anthropic.message_body(shapes.new_id(), server.config.model_id, reply, reason,
                                            out.last.stopping_word, anthropic.usage(*_counts(handle))))


async def _message_events(server: LlamaServer, req: LlamaRequest, handle: RequestHandle, body: dict) -> Events:
    stream = anthropic.MessageStream(shapes.new_id(), server.config.model_id)
    last = None
    async with contextlib.aclosing(task_pieces(server, req, handle)) as pieces:
        async for piece in pieces:
            last = piece
            n_prompt, n_cached, _ = _counts(handle)
            for event in stream.start(n_prompt, n_cached) + stream.delta(text=piece.text):
                yield event
    reason = anthropic.stop_reason((last.reason or "stop") if last else "stop", stream.reply)
    for event in stream.close(reason, last.stopping_word if last else "", _counts(handle)[2]):
        yield event


async def _response_body(server: LlamaServer, req: LlamaRequest, handle: RequestHandle) -> web.Response:
    out = await collect_task(server, req, handle)
    return json_body(responses.response_body(responses.ResponseIds.new(), server.config.model_id, out.text,
                                             responses.usage(*_counts(handle)), int(time.time())))


async def _response_events(server: LlamaServer, req: LlamaRequest, handle: RequestHandle, body: dict) -> Events:
    """response.created/in_progress with the first token (carrying prompt_progress when asked), the text
    deltas (each carrying timings with timings_per_token), then the closing events with timings."""
    ids, text, started = responses.ResponseIds.new(), "", False
    async with contextlib.aclosing(task_pieces(server, req, handle)) as pieces:
        async for piece in pieces:
            events = [] if started else responses.created_events(ids)
            if not started and body.get("return_progress"):
                events[-1][1]["prompt_progress"] = _progress(server, handle)
            started = True
            if piece.text:
                events += responses.text_events(ids, piece.text, first=not text)
                text += piece.text
            if events and body.get("timings_per_token"):
                events[-1][1]["timings"] = request_timings(handle, server.driver.now_s()).body()
            for event in events:
                yield event
    use = responses.usage(*_counts(handle))
    closing = responses.closing_events(ids, server.config.model_id, text, use, int(time.time()))
    closing[-1][1]["timings"] = request_timings(handle, server.driver.now_s()).body()
    for event in closing:
        yield event


def _progress(server: LlamaServer, handle: RequestHandle) -> dict:
    """The prompt's last processing report (the whole prompt done by the first token), built as
    /completion's return_progress builds its reports."""
    timings = request_timings(handle, server.driver.now_s())
    n_prompt, n_cached, _ = _counts(handle)
    return progress_reports(n_prompt, n_cached, server.config.n_batch, timings.prompt_ms)[-1]
