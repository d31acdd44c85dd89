"""/v1/completions and /v1/chat/completions: parse, hand to the driver, format (stream or not)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from aiohttp import web

from fake_engines.core import EngineRequest, RequestRejected, decode, encode
from fake_engines.driver.chat import chat_prompt
from fake_engines.driver.live import RequestHandle
from fake_engines.driver.serving import json_body, open_sse, send_event
from fake_engines.vllm import errors, shapes
from fake_engines.vllm.app import SERVER_KEY, EngineUnit, VllmServer
from fake_engines.vllm.telemetry import RequestParams

SSE_HEADERS = {"content-type": "text/event-stream; charset=utf-8"}
COMPLETIONS_DEFAULT_MAX_TOKENS = 16
"""OpenAI's legacy default, which vLLM keeps for /v1/completions."""


@dataclass(frozen=True)
class GenerationRequest:
    """A validated request, ready for the engine."""

    chat: bool
    """Chat (True) or text completion."""
    model: str
    """The name the response reports: the served name or the adapter."""
    lora: str | None
    """Adapter name, None for the base model."""
    prompt_ids: list[int]
    """Tokenized prompt."""
    max_tokens_param: int | None
    """max_tokens as sent."""
    stream: bool
    """Server-sent events."""
    include_usage: bool
    """stream_options.include_usage."""
    ignore_eos: bool
    """Generate exactly max_tokens."""


def _resolve_model(server: VllmServer, body: dict) -> tuple[str, str | None]:
    name = body.get("model")
    if name is None or name == server.config.model_name:
        return server.config.model_name, None
    if name in server.loras:
        return name, name
    raise errors.model_not_found(str(name), server.config.model_name)


def _prompt_ids(body: dict, chat: bool) -> list[int]:
    if chat:
        if "messages" not in body:
            raise errors.validation_error("missing", "body.messages", "Field required", body)
        if not isinstance(body["messages"], list):
            raise errors.validation_error("list_type", "body.messages", "Input should be a valid list",
                                          body["messages"])
        return encode(chat_prompt(body["messages"]))
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str) and prompt:
        return encode(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return list(prompt)
    if isinstance(prompt, list) and len(prompt) > 1:
        raise errors.bad_request("Only one prompt per request is supported by this look-alike.", "prompt")
    raise errors.bad_request("Either prompt or prompt_embeds must be provided and non-empty.", "prompt")


def parse_generation(server: VllmServer, body: dict, chat: bool) -> GenerationRequest:
    """Validate in vLLM's order: schema, model, sampling bounds, then context length."""
    stream = errors.lax_bool(body, "stream")
    errors.optional_number(body, "temperature")
    max_tokens = errors.optional_int(body, "max_completion_tokens" if chat and "max_completion_tokens" in body
                                     else "max_tokens")
    options = body.get("stream_options") or {}
    model, lora = _resolve_model(server, body)
    prompt_ids = _prompt_ids(body, chat)
    errors.check_max_tokens(max_tokens, server.config.max_model_len)
    errors.check_temperature(errors.optional_number(body, "temperature"))
    errors.check_context(len(prompt_ids), max_tokens, server.config.max_model_len)
    return GenerationRequest(chat=chat, model=model, lora=lora, prompt_ids=prompt_ids, max_tokens_param=max_tokens,
                             stream=stream, include_usage=bool(isinstance(options, dict)
                                                               and options.get("include_usage")),
                             ignore_eos=bool(body.get("ignore_eos")))


def _budget(server: VllmServer, req: GenerationRequest) -> int:
    if req.max_tokens_param is not None:
        return req.max_tokens_param
    room = server.config.max_model_len - len(req.prompt_ids)
    return room if req.chat else min(COMPLETIONS_DEFAULT_MAX_TOKENS, room)


def submit(server: VllmServer, req: GenerationRequest) -> tuple[EngineUnit, RequestHandle]:
    """Queue the request on the least loaded engine; 400 if the core refuses it."""
    budget = _budget(server, req)
    engine_request = EngineRequest(request_id=server.request_id(), prompt_token_ids=req.prompt_ids,
                                   max_tokens=budget, output_len=server.sampler.sample(budget, req.ignore_eos),
                                   lora=req.lora)
    unit = server.pick_engine()
    try:
        handle = unit.driver.submit(engine_request)
    except RequestRejected as exc:
        raise errors.bad_request(exc.message, "input_tokens", exc.n_prompt_tokens) from None
    unit.telemetry.params[engine_request.request_id] = RequestParams(req.max_tokens_param, budget)
    return unit, handle


def _usage(server: VllmServer, handle: RequestHandle, cached: int) -> shapes.Usage:
    request = handle.request
    details = cached if server.config.enable_prompt_tokens_details else None
    return shapes.Usage(request.num_prompt_tokens, len(request.output_token_ids), details)


async def _handle(request: web.Request, chat: bool) -> web.StreamResponse:
    server = request.app[SERVER_KEY]
    if not server.accepting:
        raise errors.VllmError(503, "The server is shutting down.", "ServiceUnavailableError")
    req = parse_generation(server, errors.parse_json_body(await request.read()), chat)
    unit, handle = submit(server, req)
    try:
        if req.stream:
            return await _stream(request, server, req, handle)
        return await _collect(server, req, handle)
    except (asyncio.CancelledError, ConnectionResetError):
        unit.driver.abort(handle.request.request_id)  # client went away: free the KV blocks now
        raise


async def completions(request: web.Request) -> web.StreamResponse:
    """POST /v1/completions."""
    return await _handle(request, chat=False)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    """POST /v1/chat/completions."""
    return await _handle(request, chat=True)


async def _collect(server: VllmServer, req: GenerationRequest, handle: RequestHandle) -> web.Response:
    tokens: list[int] = []
    last = None
    async for out in handle.outputs():
        tokens.extend(out.new_token_ids)
        last = out
    reason = last.finish_reason.value if last and last.finish_reason else "stop"
    usage = _usage(server, handle, last.num_cached_tokens if last else 0)
    rid, created = shapes.new_id("chatcmpl" if req.chat else "cmpl"), int(time.time())
    build = shapes.chat_body if req.chat else shapes.completion_body
    return json_body(build(rid, created, req.model, decode(tokens), reason, usage))


async def _stream(request: web.Request, server: VllmServer, req: GenerationRequest,
                  handle: RequestHandle) -> web.StreamResponse:
    rid, created = shapes.new_id("chatcmpl" if req.chat else "cmpl"), int(time.time())
    response = await open_sse(request, SSE_HEADERS)
    sent_role = False
    last = None
    async for out in handle.outputs():
        last = out
        if not out.new_token_ids and not out.finished:
            continue  # a prefill chunk that did not finish the prompt sends nothing
        if req.chat and not sent_role:
            await send_event(response, shapes.chat_role_chunk(rid, created, req.model))
            sent_role = True
        text = decode(list(out.new_token_ids))
        reason = out.finish_reason.value if out.finished and out.finish_reason else None
        chunk = shapes.chat_chunk if req.chat else shapes.completion_chunk
        await send_event(response, chunk(rid, created, req.model, text, reason))
    if req.include_usage and last is not None:
        obj = "chat.completion.chunk" if req.chat else "text_completion"
        usage = _usage(server, handle, last.num_cached_tokens)
        await send_event(response, shapes.usage_chunk(rid, obj, created, req.model, usage))
    await send_event(response, "[DONE]")
    await response.write_eof()
    return response
