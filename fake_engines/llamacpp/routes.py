"""Generation routes of the fake llama-server: /completion, /v1/completions, /v1/chat/completions.

The OpenAI routes run one task per prompt and sample (`n`, a list of prompts), as llama-server
does: one choice each, indexed prompt x n + sample, usage and timings those of the first task.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass

from aiohttp import web

from fake_engines.core import EngineRequest, RequestRejected, decode, encode
from fake_engines.driver import logprobs as made_up
from fake_engines.driver.live import RequestHandle
from fake_engines.driver.serving import json_body, write_sse
from fake_engines.driver.stops import cut_at_stop
from fake_engines.llamacpp import shapes, vocab
from fake_engines.llamacpp.app import SERVER_KEY, LlamaServer
from fake_engines.llamacpp.chat_checks import check_chat_body
from fake_engines.llamacpp.constrained import (
    Constraints,
    parse_constraints,
    plan,
    sampling_key,
    settings_logit_bias,
)
from fake_engines.llamacpp.errors import LlamaError, max_tokens, parse_json, typed
from fake_engines.llamacpp.progress import progress_reports, progress_timings
from fake_engines.llamacpp.prompts import tokenize_prompts
from fake_engines.llamacpp.telemetry import request_timings
from fake_engines.llamacpp.templates import ChatTemplates, body_prompt

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
    more_prompts: tuple[tuple[int, ...], ...] = ()
    """The prompts after the first of a /v1/completions prompt list (one choice each)."""
    n: int = 1
    """Samples per prompt (OpenAI routes)."""
    n_probs: int | None = None
    """Alternatives per token to report (logprobs / top_logprobs); None: no logprobs."""
    seed: int | None = None
    """The request's seed (its logprobs are a function of it), else the server's."""
    sampled: bool = True
    """temperature > 0 (llama-server's default 0.8): the drawn token need not be the most likely."""
    id_slot: int = -1
    """The slot asked for (`id_slot`); -1: the server picks one."""
    constraints: Constraints = Constraints()
    """grammar, JSON schema and logit bias."""
    post_sampling_probs: bool = False
    """Native n_probs as probabilities (`prob`, `top_probs`) instead of log-probabilities."""
    response_fields: tuple[str, ...] = ()
    """Native: keep only these fields ("a/b" reaches into an object); empty keeps all."""
    return_tokens: bool = False
    """Native: the generated token ids in `tokens`."""
    return_progress: bool = False
    """Streamed: prompt_progress events before the first token."""
    timings_per_token: bool = False
    """Streamed: `timings` on each prompt_progress event too (the slot's stats at that report)."""
    verbose: bool = False
    """OpenAI routes: add `__verbose` (the native final body, the prompt among it); --verbose's default."""

    @property
    def prompts(self) -> list[list[int]]:
        """Every prompt, in order."""
        return [self.prompt_ids, *(list(p) for p in self.more_prompts)]


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


def _prompt(body: dict, kind: str, templates: ChatTemplates) -> str | list[int]:
    if kind == "chat":
        if "messages" not in body:
            raise LlamaError(400, "'messages' is required")
        if not isinstance(body["messages"], list):
            raise LlamaError(400, "Expected 'messages' to be an array")
        check_chat_body(body)
        return body_prompt(templates, body)
    if "prompt" not in body:
        raise LlamaError(400, "[json.exception.out_of_range.403] key 'prompt' not found")
    return tokenize_prompts(body["prompt"])[0]  # a list of prompts: the first here, the rest in _more_prompts


def _more_prompts(body: dict, kind: str) -> tuple[tuple[int, ...], ...]:
    """The second and later prompts of a prompt list (one task each)."""
    if kind == "chat":
        return ()
    return tuple(tuple(p) for p in tokenize_prompts(body.get("prompt"))[1:])


def _n_probs(body: dict, kind: str) -> int | None:
    """Alternatives per token: n_probs (native), logprobs (completions), top_logprobs with logprobs (chat)."""
    if kind == "native":
        count = typed(body, "n_probs", float, "number")
        return int(count) if count else None
    if kind == "chat":
        if not body.get("logprobs"):
            return None
        return int(typed(body, "top_logprobs", float, "number") or 0)
    count = body.get("logprobs")
    if count is None or count is False:
        return None
    return 0 if count is True else int(typed(body, "logprobs", float, "number") or 0)


def _lora(server: LlamaServer, body: dict) -> list[dict]:
    if isinstance(body.get("lora"), list):
        return [{"id": int(x["id"]), "scale": float(x.get("scale", 1.0))} for x in body["lora"]
                if isinstance(x, dict) and isinstance(x.get("id"), int)]
    return [{"id": i, "scale": s} for i, s in enumerate(server.lora_scales)]


def parse_request(server: LlamaServer, body: dict, kind: str) -> LlamaRequest:
    """Validate as llama-server does: types first, then required fields."""
    stream = bool(typed(body, "stream", bool, "boolean"))
    temperature = typed(body, "temperature", float, "number")
    n = int(typed(body, "n", float, "number") or 1) if kind != "native" else 1
    n_predict = max_tokens(body)
    prompt = _prompt(body, kind, server.templates)
    ids = prompt if isinstance(prompt, list) else encode(prompt)
    text = decode(ids) if isinstance(prompt, list) else prompt
    options = body.get("stream_options") or {}
    return LlamaRequest(kind=kind, id_slot=_id_slot(body),
                        prompt_ids=ids, prompt_text=text, n_predict=n_predict, stream=stream,
                        include_usage=bool(isinstance(options, dict) and options.get("include_usage")),
                        ignore_eos=bool(body.get("ignore_eos")), lora=_lora(server, body), stop=_stops(body),
                        more_prompts=_more_prompts(body, kind), n=max(n, 1), n_probs=_n_probs(body, kind),
                        seed=typed(body, "seed", float, "number"), sampled=temperature is None or temperature > 0,
                        constraints=parse_constraints(body, kind), post_sampling_probs=bool(body.get("post_sampling_probs")),
                        response_fields=_response_fields(body, kind), return_tokens=bool(body.get("return_tokens")),
                        return_progress=bool(body.get("return_progress")),
                        timings_per_token=bool(body.get("timings_per_token")),
                        verbose=kind != "native" and bool(body.get("verbose", server.config.verbose)))


def _response_fields(body: dict, kind: str) -> tuple[str, ...]:
    fields = body.get("response_fields")
    if kind != "native" or not isinstance(fields, list):
        return ()
    return tuple(f for f in fields if isinstance(f, str))


def _id_slot(body: dict) -> int:
    """`id_slot` as llama-server's json_value reads it: a number, else -1."""
    value = body.get("id_slot", -1)
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else -1


def _stops(body: dict) -> list[str]:
    stop = body.get("stop")
    if isinstance(stop, str):
        return [stop]
    return [s for s in stop if isinstance(s, str)] if isinstance(stop, list) else []


def _lora_key(lora: list[dict]) -> str | None:
    active = [f"{x['id']}:{x['scale']:g}" for x in sorted(lora, key=lambda x: x["id"]) if x["scale"] != 0]
    return ",".join(active) or None


def submit(server: LlamaServer, req: LlamaRequest, prompt: list[int] | None = None, sample: int = 0) -> RequestHandle:
    """Queue on the slots; a prompt longer than a slot's context is a 400 exceed_context_size_error.
    The text is a function of the seed, the prompt and the constraints (`sample`: which of n)."""
    prompt = req.prompt_ids if prompt is None else prompt
    room = max(server.slot_n_ctx - len(prompt), 1)
    budget = room if req.n_predict < 0 else min(max(req.n_predict, 1), room)
    seed = server.config.seed if req.seed is None else int(req.seed)
    request_id = server.request_id()
    sampling, output_len = plan(req.constraints, sampling_key(seed, req.sampled, prompt, sample, request_id), budget,
                                req.ignore_eos, server.sampler.mean_output_tokens)
    request = EngineRequest(request_id=request_id, id_slot=req.id_slot,
                            prompt_token_ids=prompt, max_tokens=budget,
                            output_len=output_len, lora=_lora_key(req.lora), sampling=sampling)
    try:
        return server.driver.submit(request)
    except RequestRejected as exc:
        raise LlamaError(400, exc.message, "exceed_context_size_error", n_prompt_tokens=exc.n_prompt_tokens,
                         n_ctx=exc.n_ctx) from None


def submit_all(server: LlamaServer, req: LlamaRequest) -> list[RequestHandle]:
    """One task per prompt and sample, in choice order; none stays queued if one is refused."""
    handles: list[RequestHandle] = []
    try:
        for prompt in req.prompts:
            handles += [submit(server, req, prompt, sample) for sample in range(req.n)]
    except LlamaError:
        abort_tasks(server, handles)
        raise
    return handles


def abort_tasks(server: LlamaServer, handles: list[RequestHandle]) -> None:
    """Abort each task (the client went away, or a sibling task was refused)."""
    for handle in handles:
        server.driver.abort(handle.request.request_id)  # frees the slot at once


async def _handle(request: web.Request, kind: str) -> web.StreamResponse:
    return await serve(request, parse_json(await request.read()), kind)


async def serve(request: web.Request, body: dict, kind: str) -> web.StreamResponse:
    """Generate for a parsed body (/infill passes the prompt it assembled)."""
    server = request.app[SERVER_KEY]
    req = parse_request(server, body, kind)
    handles = submit_all(server, req)
    cancel_tasks = functools.partial(abort_tasks, server, handles)
    try:
        if req.stream:
            return await write_sse(request, SSE_HEADERS, _events(server, req, handles), cancel_tasks)
        return await _collect(server, req, handles)
    except asyncio.CancelledError:  # the client went away: aiohttp cancels the handler
        cancel_tasks()
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


async def task_pieces(server: LlamaServer, req: LlamaRequest,
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
    settings = shapes.generation_settings(req.n_predict, req.stream, req.lora, stop=req.stop)
    settings["logit_bias"] = settings_logit_bias(req.constraints, req.ignore_eos)
    settings["grammar"] = req.constraints.grammar_text
    settings["n_probs"] = req.n_probs or 0
    settings["post_sampling_probs"] = req.post_sampling_probs
    slot = request.slot_id  # not looked up in /slots: a deferred task may have taken the slot since
    stop_type = "word" if last.stopping_word else "limit" if last.reason == "length" else "eos"
    prompt = "".join(vocab.token_pieces(request.prompt_token_ids))  # the prompt as the slot holds it
    final = shapes.native_final(server.config.model_id, prompt, slot, len(request.output_token_ids),
                                request.num_prompt_tokens, timings.cache_n, stop_type, settings, timings, content,
                                last.stopping_word)
    if req.return_tokens and not req.stream:
        final["tokens"] = list(request.output_token_ids)
    if req.n_probs is not None and not req.stream:  # streamed tokens carried theirs on each chunk
        final["completion_probabilities"] = _native_probs(server, req, handle, list(request.output_token_ids), 0)
    return _only_fields(final, req.response_fields)


def _only_fields(body: dict, fields: tuple[str, ...]) -> dict:
    """llama-server's response_fields: each "a/b" path's value under that path as key, present ones only."""
    if not fields:
        return body
    out = {}
    for path in fields:
        value: object = body
        for part in path.split("/"):
            value = value.get(part, _MISSING) if isinstance(value, dict) else _MISSING
        if value is not _MISSING:
            out[path] = value
    return out


_MISSING = object()


def _native_probs(server: LlamaServer, req: LlamaRequest, handle: RequestHandle, token_ids: list[int],
                  first_position: int) -> list[dict]:
    """Native /completion's `completion_probabilities` for `n_probs`: one entry per token."""
    seed = server.config.seed if req.seed is None else int(req.seed)
    entries = made_up.request_logprobs(seed, handle.request.prompt_token_ids, first_position, token_ids,
                                       req.n_probs or 0, req.sampled)
    content = shapes.openai_logprobs(entries)["content"]
    return [_as_probs(entry) for entry in content] if req.post_sampling_probs else content


def _as_probs(entry: dict) -> dict:
    """post_sampling_probs: `prob` and `top_probs` in place of `logprob` and `top_logprobs`."""
    def one(item: dict) -> dict:
        return {"id": item["id"], "token": item["token"], "bytes": item["bytes"], "prob": math.exp(item["logprob"])}

    return {**one(entry), "top_probs": [one(t) for t in entry["top_logprobs"]]}


@dataclass
class CollectedTask:
    """One task's whole answer."""

    text: str = ""
    last: Piece = Piece("", [], "stop", "")
    token_ids: list[int] | None = None


async def collect_task(server: LlamaServer, req: LlamaRequest, handle: RequestHandle) -> CollectedTask:
    """Wait for one task's whole answer (a non-streamed reply)."""
    out = CollectedTask(token_ids=[])
    async for piece in task_pieces(server, req, handle):
        out.text += piece.text
        out.last = piece
        out.token_ids += piece.token_ids  # type: ignore[operator]
    return out


async def _collect(server: LlamaServer, req: LlamaRequest, handles: list[RequestHandle]) -> web.Response:
    results = await asyncio.gather(*(collect_task(server, req, h) for h in handles))
    use, timings = _finish(server, handles[0])  # llama-server reports the first task's usage and timings
    model, created = server.config.model_id, int(time.time())
    if req.kind == "native":
        finals = [_native_final(server, req, handle, result.last, _finish(server, handle)[1], result.text)
                  for handle, result in zip(handles, results, strict=True)]
        for index, final in enumerate(finals):
            if "index" in final:
                final["index"] = index
        return json_body(finals[0] if len(finals) == 1 else finals)
    build = shapes.chat_body if req.kind == "chat" else shapes.completion_body
    body = build(shapes.new_id(), created, model, results[0].text, results[0].last.reason or "stop", use, timings)
    body["choices"] = [_with_logprobs(server, req, handle, {**body["choices"][0], **_choice_text(req, result),
                                                            "index": i}, result.token_ids or [], 0)
                       for i, (handle, result) in enumerate(zip(handles, results, strict=True))]
    if req.verbose:
        _add_verbose(body, _native_final(server, req, handles[0], results[0].last, timings, results[0].text))
    return json_body(body)


def _add_verbose(body: dict, native: dict) -> None:
    """`__verbose` after the OpenAI fields and before `timings`, as llama-server adds it."""
    timings = body.pop("timings", None)
    body["__verbose"] = native
    if timings is not None:
        body["timings"] = timings


def _choice_text(req: LlamaRequest, result: CollectedTask) -> dict:
    reason = result.last.reason or "stop"
    if req.kind == "chat":
        return {"finish_reason": reason, "message": {"role": "assistant", "content": result.text}}
    return {"text": result.text, "finish_reason": reason}


def _with_logprobs(server: LlamaServer, req: LlamaRequest, handle: RequestHandle, choice: dict,
                   token_ids: list[int], first_position: int) -> dict:
    """`choice` with llama-server's OpenAI logprobs ({"content": [...]}) when asked for; chat
    choices carry the key only then, completion choices always (null)."""
    if req.n_probs is None:
        return choice
    seed = server.config.seed if req.seed is None else int(req.seed)
    entries = made_up.request_logprobs(seed, handle.request.prompt_token_ids, first_position, token_ids,
                                       req.n_probs, req.sampled)
    # a chat choice gains the key after its message, as captured; a completion choice's null is replaced
    return {**choice, "logprobs": shapes.openai_logprobs(entries)}


async def _merged(server: LlamaServer, req: LlamaRequest,
                  handles: list[RequestHandle]) -> AsyncGenerator[tuple[int, Piece], None]:
    """Every task's pieces as they come, with the task's choice index."""
    if len(handles) == 1:
        async with contextlib.aclosing(task_pieces(server, req, handles[0])) as pieces:
            async for piece in pieces:
                yield 0, piece
        return
    queue: asyncio.Queue[tuple[int, Piece | None]] = asyncio.Queue()

    async def pump(index: int, handle: RequestHandle) -> None:
        async for piece in task_pieces(server, req, handle):
            queue.put_nowait((index, piece))
        queue.put_nowait((index, None))

    tasks = [asyncio.create_task(pump(i, h)) for i, h in enumerate(handles)]
    try:
        remaining = len(handles)
        while remaining:
            index, got = await queue.get()
            if got is None:
                remaining -= 1
            else:
                yield index, got
    finally:
        for task in tasks:
            task.cancel()


async def _events(server: LlamaServer, req: LlamaRequest,
                  handles: list[RequestHandle]) -> AsyncGenerator[dict | str, None]:
    """The stream's events as the tasks produce tokens, then the closing ones."""
    rid, created, model = shapes.new_id(), int(time.time()), server.config.model_id
    if req.kind == "chat":
        for index in range(len(handles)):
            yield _indexed(shapes.chat_chunk(rid, created, model, {"role": "assistant", "content": None}, None), index)
    lasts = [Piece("", [], "stop", "") for _ in handles]
    predicted = [0] * len(handles)
    async with contextlib.aclosing(_merged(server, req, handles)) as pieces:
        async for index, piece in pieces:
            lasts[index] = piece
            if not piece.token_ids:
                continue
            if req.return_progress and not predicted[index]:
                for event in _progress_events(server, req, handles[index], rid, created, model, index):
                    yield event
            predicted[index] += len(piece.token_ids)
            if piece.text or not piece.stopping_word:
                event = _token_event(req, rid, created, model, piece, predicted[index])
                if req.kind == "native" and req.n_probs is not None:
                    event["completion_probabilities"] = _native_probs(
                        server, req, handles[index], piece.token_ids, predicted[index] - len(piece.token_ids))
                if req.kind == "native":
                    event["index"] = index  # a list of prompts: each task's chunks carry its index
                else:
                    event = _indexed(event, index)
                    event["choices"][0] = _with_logprobs(server, req, handles[index], event["choices"][0],
                                                         piece.token_ids, predicted[index] - len(piece.token_ids))
                yield event
    use, timings = _finish(server, handles[0])
    for event in _closing_events(server, req, handles, rid, created, model, lasts, use, timings):
        yield event


def _progress_events(server: LlamaServer, req: LlamaRequest, handle: RequestHandle, rid: str, created: int,
                     model: str, index: int) -> list[dict]:
    """The prompt's progress reports, each on an event of the route's kind carrying no text."""
    request = handle.request
    prompt_ms = request_timings(handle, server.driver.now_s()).prompt_ms
    events = []
    for report in progress_reports(request.num_prompt_tokens, request.num_cached_tokens or 0,
                                   server.config.n_batch, prompt_ms):
        if req.kind == "chat":
            event = _indexed(shapes.chat_chunk(rid, created, model, {"role": "assistant", "content": None}, None), index)
        elif req.kind == "completion":
            event = _indexed(shapes.completion_chunk(rid, created, model, "", None), index)
        else:
            event = {**shapes.native_chunk("", [], 0, request.num_prompt_tokens), "index": index}
        if req.timings_per_token:
            event["timings"] = progress_timings(report, prompt_ms)
        events.append({**event, "prompt_progress": report})
    return events


def _indexed(event: dict, index: int) -> dict:
    event["choices"][0]["index"] = index
    return event


def _token_event(req: LlamaRequest, rid: str, created: int, model: str, piece: Piece, predicted: int) -> dict:
    if req.kind == "chat":
        return shapes.chat_chunk(rid, created, model, {"content": piece.text}, None)
    if req.kind == "completion":
        return shapes.completion_chunk(rid, created, model, piece.text, None)
    return shapes.native_chunk(piece.text, piece.token_ids, predicted, len(req.prompt_ids))


def _closing_events(server, req, handles, rid, created, model, lasts: list[Piece], use, timings) -> list:
    if req.kind == "native":
        return [{**_native_final(server, req, handle, last, _finish(server, handle)[1], ""), "index": i}
                for i, (handle, last) in enumerate(zip(handles, lasts, strict=True))]
    if req.kind == "completion":
        finals = [_indexed(shapes.completion_final_chunk(rid, created, model, last.reason or "stop", use, timings), i)
                  for i, last in enumerate(lasts)]
        if req.verbose:  # every task's final chunk carries its own
            finals = [_verbose_event(server, req, h, last, timings, f) for h, last, f in zip(handles, lasts, finals,
                                                                                           strict=True)]
        return [*finals, "[DONE]"]
    finishes = [_indexed(shapes.chat_chunk(rid, created, model, {}, last.reason or "stop"), i)
                for i, last in enumerate(lasts)]
    if not req.include_usage:
        events = [*finishes[:-1], {**finishes[-1], "timings": timings.body()}]
    else:
        events = [*finishes, {**shapes.chat_chunk(rid, created, model, {}, None), "choices": [], "usage": use,
                              "timings": timings.body()}]
    if req.verbose:  # the first of the closing deltas carries it
        events[0] = _verbose_event(server, req, handles[0], lasts[0], timings, events[0])
    return [*events, "[DONE]"]


def _verbose_event(server: LlamaServer, req: LlamaRequest, handle: RequestHandle, last: Piece,
                   timings: shapes.Timings, event: dict) -> dict:
    return {**event, "__verbose": _native_final(server, req, handle, last, timings, "")}
