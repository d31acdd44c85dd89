"""/v1/completions and /v1/chat/completions: parse, hand to the engines, format (stream or not).

A request with `n` > 1 or a list of prompts becomes one engine request per choice, as in vLLM
(choice index = prompt index x n + sample index); their outputs are merged into one response.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass

from aiohttp import web

from fake_engines.core import EngineRequest, RequestRejected, Sampling, decode, encode
from fake_engines.driver import logprobs as made_up
from fake_engines.driver.chat import chat_prompt
from fake_engines.driver.serving import json_body, write_sse
from fake_engines.vllm import choices as choices_mod
from fake_engines.vllm import errors, nixl, shapes
from fake_engines.vllm import logprobs as vllm_logprobs
from fake_engines.vllm.app import SERVER_KEY, VllmServer
from fake_engines.vllm.choices import Choice
from fake_engines.vllm.structured import Structured, parse_structured
from fake_engines.vllm.telemetry import RequestParams

SSE_HEADERS = {"content-type": "text/event-stream; charset=utf-8"}
COMPLETIONS_DEFAULT_MAX_TOKENS = 16
"""OpenAI's legacy default, which vLLM keeps for /v1/completions."""


@dataclass(frozen=True)
class GenerationRequest:
    """A validated request, ready for the engines."""

    chat: bool
    """Chat (True) or text completion."""
    model: str
    """The name the response reports: the served name or the adapter."""
    lora: str | None
    """Adapter name, None for the base model."""
    prompts: list[list[int]]
    """Tokenized prompts (one for chat)."""
    n: int
    """Samples per prompt."""
    max_tokens_param: int | None
    """max_tokens as sent."""
    stream: bool
    """Server-sent events."""
    include_usage: bool
    """stream_options.include_usage."""
    continuous_usage: bool
    """stream_options.continuous_usage_stats: usage so far on every chunk."""
    ignore_eos: bool
    """Generate exactly max_tokens."""
    stop: list[str]
    """Stop strings: the text ends before the first one that appears."""
    logprobs: int | None = None
    """Alternatives per token to report (completions `logprobs`, chat `top_logprobs`); None: no logprobs."""
    echo: bool = False
    """Completions `echo`: the prompt leads the text (and the logprobs)."""
    seed: int | None = None
    """The request's seed (its logprobs are a function of it), else the server's."""
    sampled: bool = True
    """temperature > 0 (vLLM's default 1.0): the drawn token need not be the most likely."""
    prompt_logprobs: int | None = None
    """Likeliest tokens to report per prompt token (`prompt_logprobs`); None: none."""
    kv_transfer_params: dict | None = None
    """Disaggregated prefill/decode parameters (fake_engines/vllm/nixl.py); None: colocated."""
    structured: Structured | None = None
    """structured_outputs / response_format: the text follows it, then the request ends."""


def _logprobs_param(body: dict, chat: bool) -> int | None:
    """How many alternatives per token the request asks for, in vLLM's validation order."""
    if chat:
        top = errors.optional_int(body, "top_logprobs")
        if top is not None and top < 0 and top != -1:
            raise errors.bad_request("`top_logprobs` must be a positive value or -1.", "top_logprobs", top)
        if top is not None and top != 0 and not errors.lax_bool(body, "logprobs"):
            raise errors.bad_request("when using `top_logprobs`, `logprobs` must be set to true.", "top_logprobs")
        count = (top or 0) if errors.lax_bool(body, "logprobs") else None
    else:
        count = errors.optional_int(body, "logprobs")
        if count is not None and count < 0 and count != -1:
            raise errors.bad_request("`logprobs` must be a positive value or -1.", "logprobs", count)
    if count is not None and count > vllm_logprobs.MAX_LOGPROBS:
        raise errors.bad_request(f"Requested sample logprobs of {count}, which is greater than max allowed: "
                                 f"{vllm_logprobs.MAX_LOGPROBS}", "logprobs", count)
    return count


def _prompt_logprobs_param(body: dict, stream: bool) -> int | None:
    count = errors.optional_int(body, "prompt_logprobs")
    if count is None:
        return None
    if stream and (count > 0 or count == -1):
        raise errors.bad_request("`prompt_logprobs` are not available when `stream=True`.", "prompt_logprobs")
    if count < 0 and count != -1:
        raise errors.bad_request("`prompt_logprobs` must be a positive value or -1.", "prompt_logprobs", count)
    if count > vllm_logprobs.MAX_LOGPROBS:
        raise errors.bad_request(f"Requested prompt logprobs of {count}, which is greater than max allowed: "
                                 f"{vllm_logprobs.MAX_LOGPROBS}", "prompt_logprobs", count)
    return count


def _resolve_model(server: VllmServer, body: dict) -> tuple[str, str | None]:
    name = body.get("model")
    if name is None or name == server.config.model_name:
        return server.config.model_name, None
    if name in server.loras:
        return name, name
    raise errors.model_not_found(str(name), server.config.model_name)


def _chat_prompt_ids(body: dict) -> list[list[int]]:
    if "messages" not in body:
        raise errors.validation_error("missing", "body.messages", "Field required", body)
    if not isinstance(body["messages"], list):
        raise errors.validation_error("list_type", "body.messages", "Input should be a valid list", body["messages"])
    return [encode(chat_prompt(body["messages"]))]


def _completion_prompt_ids(body: dict) -> list[list[int]]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        prompt = [prompt]
    elif isinstance(prompt, str):
        prompt = [prompt]
    if not isinstance(prompt, list) or not prompt or any(not p for p in prompt):
        raise errors.bad_request("Either prompt or prompt_embeds must be provided and non-empty.", "prompt")
    return [encode(p) if isinstance(p, str) else list(p) for p in prompt]


def parse_generation(server: VllmServer, body: dict, chat: bool) -> GenerationRequest:
    """Validate in vLLM's order: schema, model, sampling bounds, then context length."""
    stream = errors.lax_bool(body, "stream")
    temperature = errors.optional_number(body, "temperature")
    max_tokens = errors.optional_int(body, "max_completion_tokens" if chat and "max_completion_tokens" in body
                                     else "max_tokens")
    n = errors.optional_int(body, "n") or 1
    seed = errors.optional_int(body, "seed")
    logprobs = _logprobs_param(body, chat)
    prompt_logprobs = _prompt_logprobs_param(body, stream)
    options = body.get("stream_options") or {}
    model, lora = _resolve_model(server, body)
    prompts = _chat_prompt_ids(body) if chat else _completion_prompt_ids(body)
    errors.check_max_tokens(max_tokens, server.max_model_len)
    errors.check_temperature(temperature)
    if n < 1:
        raise errors.bad_request(f"n must be at least 1, got {n}.", "n", n)
    for ids in prompts:
        errors.check_context(len(ids), max_tokens, server.max_model_len)
    return GenerationRequest(chat=chat, model=model, lora=lora, prompts=prompts, n=n, max_tokens_param=max_tokens,
                             stream=stream, include_usage=_option(options, "include_usage"),
                             continuous_usage=_option(options, "include_usage")
                             and _option(options, "continuous_usage_stats"),
                             ignore_eos=bool(body.get("ignore_eos")), stop=_stop_strings(body),
                             logprobs=logprobs, echo=not chat and errors.lax_bool(body, "echo"), seed=seed,
                             sampled=temperature is None or temperature > 0, prompt_logprobs=prompt_logprobs,
                             kv_transfer_params=_kv_transfer_params(body), structured=parse_structured(body))


def _kv_transfer_params(body: dict) -> dict | None:
    params = body.get("kv_transfer_params")
    if params is not None and not isinstance(params, dict):
        raise errors.validation_error("dict_type", "body.kv_transfer_params", "Input should be a valid dictionary",
                                      params)
    return params


def _stop_strings(body: dict) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        return stop
    raise errors.validation_error("string_type", "body.stop", "Input should be a valid string", stop)


def _option(options: object, name: str) -> bool:
    return bool(isinstance(options, dict) and options.get(name))


def _budget(server: VllmServer, req: GenerationRequest, prompt: list[int]) -> int:
    if req.max_tokens_param is not None:
        return req.max_tokens_param
    room = server.max_model_len - len(prompt)
    return room if req.chat else min(COMPLETIONS_DEFAULT_MAX_TOKENS, room)


def _submit_one(server: VllmServer, req: GenerationRequest, prompt: list[int], first_sample: bool,
                role: str | None = None) -> Choice:
    budget = _budget(server, req, prompt)
    request_id = server.request_id()
    sampling, output_len = None, server.sampler.sample(budget, req.ignore_eos)
    if req.structured is not None:  # seeded by the request's seed, else per request as vLLM's sampler
        key = f"{server.config.seed if req.seed is None else req.seed}/{request_id if req.seed is None else prompt}"
        planned = tuple(encode(req.structured.text(random.Random(key))))
        sampling, output_len = Sampling(key, planned), budget if req.ignore_eos else len(planned)
    engine_request = EngineRequest(request_id=request_id, prompt_token_ids=prompt, max_tokens=budget,
                                   output_len=output_len, lora=req.lora, sampling=sampling,
                                   kv_transfer_hold=role == "prefill", remote_prefill=role == "decode",
                                   waiting_for_remote_kvs=role == "decode")
    unit = server.pick_engine()
    try:
        handle = unit.driver.submit(engine_request)
    except RequestRejected as exc:
        raise errors.bad_request(exc.message, "input_tokens", exc.n_prompt_tokens) from None
    # vLLM observes n and the generation budget once per parent request, the rest per sample
    unit.telemetry.params[engine_request.request_id] = RequestParams(req.max_tokens_param, budget, req.n,
                                                                     first_sample)
    return Choice(-1, unit, handle)


def pd_role(connector: nixl.NixlConnector | None, req: GenerationRequest) -> str | None:
    """The part this request plays in disaggregated serving: "prefill" (do_remote_decode, not
    streamed), "decode" (do_remote_prefill with the remote fields) or None. Without a connector
    vLLM ignores the params; the look-alike also plays no part for n > 1 or several prompts."""
    if connector is None or req.n != 1 or len(req.prompts) != 1:
        return None
    if nixl.wants_remote_decode(req.kv_transfer_params) and not req.stream:
        return "prefill"
    if nixl.wants_remote_prefill(req.kv_transfer_params):
        return "decode"
    return None


def submit(server: VllmServer, req: GenerationRequest, role: str | None = None) -> list[Choice]:
    """One engine request per choice, each on the least loaded engine at its turn."""
    choices: list[Choice] = []
    try:
        for p, prompt in enumerate(req.prompts):
            for sample in range(req.n):
                choice = _submit_one(server, req, prompt, sample == 0, role)
                choice.index = p * req.n + sample
                choices.append(choice)
    except errors.VllmError:
        choices_mod.abort(choices)
        raise
    return choices


def _usage(server: VllmServer, req: GenerationRequest, choices: list[Choice], cached: int) -> shapes.Usage:
    prompt_tokens = sum(len(p) for p in req.prompts)  # each prompt once, however many samples
    completion_tokens = sum(len(c.handle.request.output_token_ids) for c in choices)
    details = cached if server.config.enable_prompt_tokens_details else None
    return shapes.Usage(prompt_tokens, completion_tokens, details)


async def _handle(request: web.Request, chat: bool) -> web.StreamResponse:
    server = request.app[SERVER_KEY]
    if not server.accepting:
        raise errors.VllmError(503, "The server is shutting down.", "ServiceUnavailableError")
    req = parse_generation(server, errors.parse_json_body(await request.read()), chat)
    connector = request.app.get(nixl.NIXL_KEY)
    role = pd_role(connector, req)
    choices = submit(server, req, role)
    try:
        if role == "decode":
            await connector.pull(choices[0].unit, choices[0].handle.request, req.kv_transfer_params)  # type: ignore[union-attr,arg-type]
        if req.stream:
            return await write_sse(request, SSE_HEADERS, _events(server, req, choices),
                                   lambda: choices_mod.abort(choices))
        body = await _collect(server, req, choices)
        if role == "prefill":
            port = request.transport.get_extra_info("sockname")[1] if request.transport else 0
            body["kv_transfer_params"] = connector.hold(choices[0].unit, choices[0].handle.request.request_id, port)  # type: ignore[union-attr]
        return json_body(body)
    except asyncio.CancelledError:  # the client went away: aiohttp cancels the handler
        choices_mod.abort(choices)
        raise


async def completions(request: web.Request) -> web.StreamResponse:
    """POST /v1/completions."""
    return await _handle(request, chat=False)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    """POST /v1/chat/completions."""
    return await _handle(request, chat=True)


async def _collect(server: VllmServer, req: GenerationRequest, choices: list[Choice]) -> dict:
    texts: dict[int, str] = {}
    tokens: dict[int, list[int]] = {}
    ends: dict[int, tuple[str, str | None]] = {}
    cached = 0
    async for delta in choices_mod.deltas(choices, req.stop):
        texts[delta.index] = texts.get(delta.index, "") + delta.text
        tokens.setdefault(delta.index, []).extend(delta.token_ids)
        if delta.finish_reason is not None:
            ends[delta.index] = (delta.finish_reason, delta.stop_reason)
            cached += delta.cached_tokens if delta.index % req.n == 0 else 0
    usage = _usage(server, req, choices, cached)
    rid, created = shapes.new_id("chatcmpl" if req.chat else "cmpl"), int(time.time())
    build = shapes.chat_body if req.chat else shapes.completion_body
    body = build(rid, created, req.model, "", "stop", usage)
    by_index = {c.index: c for c in choices}
    if req.chat and req.prompt_logprobs is not None:  # chat: one prompt, reported once at the top level
        body["prompt_logprobs"] = _prompt_logprobs(server, req, choices[0])
    body["choices"] = [{**body["choices"][0],
                        **_choice_fields(req, _echoed(req, by_index[i]) + texts.get(i, ""), *ends.get(i, ("stop", None))),
                        "logprobs": _choice_logprobs(server, req, by_index[i], tokens.get(i, []), 0, echo=req.echo),
                        **({"prompt_logprobs": _prompt_logprobs(server, req, by_index[i])}
                           if not req.chat and req.prompt_logprobs is not None else {}),
                        "index": i} for i in range(len(choices))]
    return body


def _prompt_logprobs(server: VllmServer, req: GenerationRequest, choice: Choice) -> list[dict | None]:
    """The prompt's tokens scored as vLLM's prompt_logprobs: the first has none."""
    prompt = list(choice.handle.request.prompt_token_ids)
    seed = server.config.seed if req.seed is None else req.seed
    count = req.prompt_logprobs or 0
    scored = made_up.request_logprobs(seed, prompt, -len(prompt), prompt, count if count >= 0 else 20)
    return vllm_logprobs.prompt_logprobs([None, *scored[1:]])


def _echoed(req: GenerationRequest, choice: Choice) -> str:
    return decode(list(choice.handle.request.prompt_token_ids)) if req.echo else ""


def _choice_logprobs(server: VllmServer, req: GenerationRequest, choice: Choice, token_ids: list[int],
                     first_position: int, echo: bool = False, text_offset: int = 0) -> dict | None:
    """The choice's logprobs for `token_ids` (output positions from `first_position`), in the
    request's shape; with `echo`, the prompt's tokens first. None when not asked for."""
    if req.logprobs is None:
        return None
    prompt = list(choice.handle.request.prompt_token_ids)
    seed = server.config.seed if req.seed is None else req.seed
    entries: list[made_up.TokenLogprobs | None] = list(
        made_up.request_logprobs(seed, prompt, first_position, token_ids, req.logprobs, req.sampled))
    if req.chat:
        return vllm_logprobs.chat_logprobs([e for e in entries if e], req.logprobs)
    ids = token_ids
    if echo:  # the prompt's tokens, at negative positions, the first one without a logprob
        before = made_up.request_logprobs(seed, prompt, -len(prompt), prompt, req.logprobs)
        entries, ids = [None, *before[1:], *entries], prompt + token_ids
    return vllm_logprobs.completion_logprobs(entries, [decode([t]) for t in ids], req.logprobs, text_offset)


def _choice_fields(req: GenerationRequest, text: str, reason: str, stop_reason: str | None) -> dict:
    if req.chat:
        message = {"role": "assistant", "content": text, "refusal": None, "annotations": None, "audio": None,
                   "function_call": None, "reasoning": None}
        return {"message": message, "finish_reason": reason, "stop_reason": stop_reason}
    return {"text": text, "finish_reason": reason, "stop_reason": stop_reason}


async def _events(server: VllmServer, req: GenerationRequest,
                  choices: list[Choice]) -> AsyncGenerator[dict | str, None]:
    """The stream's events as the choices produce them, then usage (if asked) and [DONE]."""
    rid, created = shapes.new_id("chatcmpl" if req.chat else "cmpl"), int(time.time())
    started: set[int] = set()
    cached = 0
    generated: dict[int, int] = {}  # choice -> tokens as of its latest output
    by_index = {c.index: c for c in choices}
    offsets: dict[int, int] = {}  # choice -> characters sent (completions' text_offset)
    async with contextlib.aclosing(choices_mod.deltas(choices, req.stop)) as deltas:
        async for delta in deltas:
            generated[delta.index] = delta.num_output_tokens
            if not delta.has_tokens and delta.finish_reason is None:
                continue  # a prefill chunk that did not finish the prompt sends nothing
            if req.chat and delta.index not in started:
                yield _indexed(shapes.chat_role_chunk(rid, created, req.model), delta.index)
                started.add(delta.index)
            chunk = shapes.chat_chunk if req.chat else shapes.completion_chunk
            first = req.echo and delta.index not in offsets
            text = (_echoed(req, by_index[delta.index]) if first else "") + delta.text
            event = _indexed(chunk(rid, created, req.model, text, delta.finish_reason, delta.stop_reason),
                             delta.index)
            event["choices"][0]["logprobs"] = _choice_logprobs(
                server, req, by_index[delta.index], list(delta.token_ids),
                delta.num_output_tokens - len(delta.token_ids), echo=first, text_offset=offsets.get(delta.index, 0))
            offsets[delta.index] = offsets.get(delta.index, 0) + len(text)
            if delta.finish_reason is not None and not req.include_usage:
                # vLLM stamps its fingerprint on a terminal chunk when no usage chunk follows
                event["system_fingerprint"] = shapes.SYSTEM_FINGERPRINT
            if req.continuous_usage:  # usage as of this chunk, even if later steps already ran
                so_far = shapes.Usage(_usage(server, req, choices, cached).prompt_tokens, sum(generated.values()),
                                      cached if server.config.enable_prompt_tokens_details else None)
                event["usage"] = so_far.body(False)
            yield event
            if delta.finish_reason is not None and delta.index % req.n == 0:
                cached += delta.cached_tokens
    if req.include_usage:
        obj = "chat.completion.chunk" if req.chat else "text_completion"
        yield shapes.usage_chunk(rid, obj, created, req.model, _usage(server, req, choices, cached))
    yield "[DONE]"


def _indexed(chunk: dict, index: int) -> dict:
    chunk["choices"][0]["index"] = index
    return chunk
