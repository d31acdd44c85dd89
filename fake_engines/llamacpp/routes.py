"""Generation routes of the fake llama-server: /completion, /v1/completions, /v1/chat/completions."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass

from aiohttp import web

from fake_engines.core import EngineRequest, RequestRejected, decode, encode
from fake_engines.driver.chat import chat_prompt
from fake_engines.driver.live import RequestHandle
from fake_engines.driver.serving import json_body, write_sse
from fake_engines.driver.stops import cut_at_stop
from fake_engines.llamacpp import shapes
from fake_engines.llamacpp.app import SERVER_KEY, LlamaServer
from fake_engines.llamacpp.errors import LlamaError, max_tokens, parse_json, typed
from fake_engines.llamacpp.telemetry import request_timings

SSE_HEADERS = {"X-Accel-Buffering": "no", "Content-Type": "text/event-stream"}


@dataclass(frozen=True)
class LlamaRequest:
    """A validated generation request."""

    kind: str
    """"native", "completion" or "chat"."""
    prompt_ids: list[int]
    """Tokenized prompt."""
    prompt_text: str
    """The prompt as text (native responses echo it)."""
    n_predict: int
    """Most tokens to generate; -1 for up to the slot's context."""
    stream: bool
    """Server-sent events."""
    include_usage: bool
    """stream_options.include_usage (chat only changes shape)."""
    ignore_eos: bool
    """Generate exactly n_predict."""
    lora: list[dict]
    """[{"id", "scale"}] in force for this request."""
    stop: list[str]
    """Stop strings: generation ends before the first one that appears."""


@dataclass(frozen=True)
class Piece:
    """Text a request produced in one step, after stop strings."""

    text: str
    """New text."""
    token_ids: list[int]
    """Tokens of this step."""
    reason: str | None
    """length / stop when this is the request's last piece."""
    stopping_word: str
    """The stop string that ended the request, else ""."""


def _prompt(body: dict, kind: str) -> str | list[int]:
    if kind == "chat":
        if "messages" not in body:
            raise LlamaError(400, "'messages' is required")
        if not isinstance(body["messages"], list):
            raise LlamaError(400, "Expected 'messages' to be an array")
        return chat_prompt(body["messages"])
    if "prompt" not in body:
        raise LlamaError(400, "[json.exception.out_of_range.403] key 'prompt' not found")
    prompt = body["prompt"]
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        return list(prompt)
    if not isinstance(prompt, str):
        raise LlamaError(400, "\"prompt\" must be a string, a list of tokens or a list of one prompt")
    return prompt


def _lora(server: LlamaServer, body: dict) -> list[dict]:
    if isinstance(body.get("lora"), list):
        return [{"id": int(x["id"]), "scale": float(x.get("scale", 1.0))} for x in body["lora"]
                if isinstance(x, dict) and isinstance(x.get("id"), int)]
    return [{"id": i, "scale": s} for i, s in enumerate(server.lora_scales)]


def parse_request(server: LlamaServer, body: dict, kind: str) -> LlamaRequest:
    """Validate as llama-server does: types first, then required fields."""
    stream = bool(typed(body, "stream", bool, "boolean"))
    typed(body, "temperature", float, "number")
    n_predict = max_tokens(body)
    prompt = _prompt(body, kind)
    ids = prompt if isinstance(prompt, list) else encode(prompt)
    text = decode(ids) if isinstance(prompt, list) else prompt
    options = body.get("stream_options") or {}
    return LlamaRequest(kind=kind, prompt_ids=ids, prompt_text=text, n_predict=n_predict, stream=stream,
                        include_usage=bool(isinstance(options, dict) and options.get("include_usage")),
                        ignore_eos=bool(body.get("ignore_eos")), lora=_lora(server, body), stop=_stops(body))


def _stops(body: dict) -> list[str]:
    stop = body.get("stop")
    if isinstance(stop, str):
        return [stop]
    return [s for s in stop if isinstance(s, str)] if isinstance(stop, list) else []


def _lora_key(lora: list[dict]) -> str | None:
    active = [f"{x['id']}:{x['scale']:g}" for x in sorted(lora, key=lambda x: x["id"]) if x["scale"] != 0]
    return ",".join(active) or None


def submit(server: LlamaServer, req: LlamaRequest) -> RequestHandle:
    """Queue on the slots; a prompt longer than a slot's context is a 400 exceed_context_size_error."""
    room = max(server.slot_n_ctx - len(req.prompt_ids), 1)
    budget = room if req.n_predict < 0 else min(max(req.n_predict, 1), room)
    request = EngineRequest(request_id=server.request_id(), prompt_token_ids=req.prompt_ids, max_tokens=budget,
                            output_len=server.sampler.sample(budget, req.ignore_eos), lora=_lora_key(req.lora))
    try:
        return server.driver.submit(request)
    except RequestRejected as exc:
        raise LlamaError(400, exc.message, "exceed_context_size_error", n_prompt_tokens=exc.n_prompt_tokens,
                         n_ctx=exc.n_ctx) from None


async def _handle(request: web.Request, kind: str) -> web.StreamResponse:
    server = request.app[SERVER_KEY]
    req = parse_request(server, parse_json(await request.read()), kind)
    handle = submit(server, req)
    cancel_task = functools.partial(server.driver.abort, handle.request.request_id)  # frees the slot at once
    try:
        if req.stream:
            return await write_sse(request, SSE_HEADERS, _events(server, req, handle), cancel_task)
        return await _collect(server, req, handle)
    except asyncio.CancelledError:  # the client went away: aiohttp cancels the handler
        cancel_task()
        raise


async def native_completion(request: web.Request) -> web.StreamResponse:
    """POST /completion (llama.cpp's own API)."""
    return await _handle(request, "native")


async def completions(request: web.Request) -> web.StreamResponse:
    """POST /v1/completions."""
    return await _handle(request, "completion")


async def chat_completions(request: web.Request) -> web.StreamResponse:
    """POST /v1/chat/completions."""
    return await _handle(request, "chat")


async def _pieces(server: LlamaServer, req: LlamaRequest,
                  handle: RequestHandle) -> AsyncGenerator[Piece, None]:
    """The request's text step by step; a matched stop string ends the task at once."""
    sent = ""
    async for out in handle.outputs():
        new, stop = cut_at_stop(sent, decode(list(out.new_token_ids)), req.stop)
        sent += new
        if stop is not None:
            server.driver.stop_early(handle.request.request_id)
            yield Piece(new, list(out.new_token_ids), "stop", stop)
            return
        reason = (out.finish_reason.value if out.finish_reason else "stop") if out.finished else None
        yield Piece(new, list(out.new_token_ids), reason, "")


def _finish(server: LlamaServer, handle: RequestHandle) -> tuple[dict, shapes.Timings]:
    request = handle.request
    timings = request_timings(handle, server.driver.now_s())
    use = shapes.usage(request.num_prompt_tokens, len(request.output_token_ids), timings.cache_n)
    return use, timings


def _native_final(server: LlamaServer, req: LlamaRequest, handle: RequestHandle, last: Piece,
                  timings: shapes.Timings, content: str) -> dict:
    request = handle.request
    settings = shapes.generation_settings(req.n_predict, req.stream, req.lora)
    slot = next((s.id for s in server.driver.core.stats().slots if s.request_id == request.request_id), -1)
    stop_type = "word" if last.stopping_word else "limit" if last.reason == "length" else "eos"
    return shapes.native_final(server.config.model_id, req.prompt_text, slot, len(request.output_token_ids),
                               request.num_prompt_tokens, timings.cache_n, stop_type, settings, timings, content,
                               last.stopping_word)


async def _collect(server: LlamaServer, req: LlamaRequest, handle: RequestHandle) -> web.Response:
    text, last = "", Piece("", [], "stop", "")
    async for piece in _pieces(server, req, handle):
        text += piece.text
        last = piece
    use, timings = _finish(server, handle)
    model, created = server.config.model_id, int(time.time())
    if req.kind == "native":
        return json_body(_native_final(server, req, handle, last, timings, text))
    build = shapes.chat_body if req.kind == "chat" else shapes.completion_body
    return json_body(build(shapes.new_id(), created, model, text, last.reason or "stop", use, timings))


async def _events(server: LlamaServer, req: LlamaRequest,
                  handle: RequestHandle) -> AsyncGenerator[dict | str, None]:
    """The stream's events as the task produces tokens, then the closing ones."""
    rid, created, model = shapes.new_id(), int(time.time()), server.config.model_id
    if req.kind == "chat":
        yield shapes.chat_chunk(rid, created, model, {"role": "assistant", "content": None}, None)
    last, predicted = Piece("", [], "stop", ""), 0
    async with contextlib.aclosing(_pieces(server, req, handle)) as pieces:
        async for piece in pieces:
            last = piece
            if not piece.token_ids:
                continue
            predicted += len(piece.token_ids)
            if piece.text or not piece.stopping_word:
                yield _token_event(req, rid, created, model, piece, predicted)
    use, timings = _finish(server, handle)
    for event in _closing_events(server, req, handle, rid, created, model, last, use, timings):
        yield event


def _token_event(req: LlamaRequest, rid: str, created: int, model: str, piece: Piece, predicted: int) -> dict:
    if req.kind == "chat":
        return shapes.chat_chunk(rid, created, model, {"content": piece.text}, None)
    if req.kind == "completion":
        return shapes.completion_chunk(rid, created, model, piece.text, None)
    return shapes.native_chunk(piece.text, piece.token_ids, predicted, len(req.prompt_ids))


def _closing_events(server, req, handle, rid, created, model, last: Piece, use, timings) -> list:
    reason = last.reason or "stop"
    if req.kind == "native":
        return [_native_final(server, req, handle, last, timings, "")]
    if req.kind == "completion":
        return [shapes.completion_final_chunk(rid, created, model, reason, use, timings), "[DONE]"]
    finish = shapes.chat_chunk(rid, created, model, {}, reason)
    if not req.include_usage:
        return [{**finish, "timings": timings.body()}, "[DONE]"]
    usage_chunk = {**shapes.chat_chunk(rid, created, model, {}, None), "choices": [], "usage": use,
                   "timings": timings.body()}
    return [finish, usage_chunk, "[DONE]"]
