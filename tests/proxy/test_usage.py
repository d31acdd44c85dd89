"""Reading usage from responses, and taking the usage event the proxy asked for out of streams."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from aiohttp import web

from proxy.usage import Usage, UsageEventFilter, _usage_of, usage_from_json, usage_from_sse_tail
from tests.conftest import DATA

REAL = DATA / "real-engines"


def _body(rel: str) -> bytes:
    raw = (REAL / rel).read_bytes().replace(b"\r\n", b"\n")
    return raw.split(b"\n\n", 1)[1]


def test_usage_of_a_non_streamed_vllm_answer() -> None:
    usage = usage_from_json(b'{"usage":{"prompt_tokens":11,"completion_tokens":71,'
                            b'"prompt_tokens_details":{"cached_tokens":8}}}')
    assert usage == Usage(prompt_tokens=11, cached_tokens=8, reports_cache=True) and usage.prefill_tokens == 3


def test_usage_chunk_at_the_end_of_a_real_llama_server_stream() -> None:
    usage = usage_from_sse_tail(_body("llama.cpp/021_chat_stream_include_usage.http")[-8192:])
    assert usage == Usage(prompt_tokens=19, cached_tokens=18, reports_cache=True)


def test_a_usage_without_cache_details_says_the_engine_did_not_report_it() -> None:
    # vLLM without --enable-prompt-tokens-details: prompt_tokens_details is null, not 0 hits
    usage = usage_from_json(b'{"usage":{"prompt_tokens":11,"prompt_tokens_details":null}}')
    assert usage == Usage(prompt_tokens=11, cached_tokens=0, reports_cache=False)


def test_a_stream_without_usage_gives_none() -> None:
    assert usage_from_sse_tail(b'data: {"choices":[{"text":"a"}]}\n\ndata: [DONE]\n\n') is None


def _filtered(*chunks: bytes) -> bytes:
    f = UsageEventFilter()
    return b"".join(f.feed(c) for c in chunks) + f.flush()


USAGE_EVENT = b'data: {"id":"c","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1}}'


def test_usage_only_events_are_dropped_and_everything_else_kept() -> None:
    chunk = (b'data: {"choices":[{"text":"a"}],"usage":null}\n\n' + USAGE_EVENT + b"\n\ndata: [DONE]\n\n")
    assert _filtered(chunk) == b'data: {"choices":[{"text":"a"}],"usage":null}\n\ndata: [DONE]\n\n'
    assert _filtered(USAGE_EVENT + b"\n\n") == b""
    assert _filtered(b'data: {"choices":[{"text":"usage"}]}\n\n') == b'data: {"choices":[{"text":"usage"}]}\n\n'


def test_a_usage_event_split_at_every_byte_is_still_dropped() -> None:
    stream = b'data: {"choices":[{"text":"a"}]}\n\n' + USAGE_EVENT + b"\n\ndata: [DONE]\n\n"
    for cut in range(1, len(stream)):
        assert _filtered(stream[:cut], stream[cut:]) == b'data: {"choices":[{"text":"a"}]}\n\ndata: [DONE]\n\n', cut


def test_crlf_and_cr_framed_usage_events_are_dropped_byte_by_byte() -> None:
    for nl in (b"\r\n", b"\r"):
        stream = b'data: {"choices":[{"text":"a"}]}' + nl * 2 + USAGE_EVENT + nl * 2 + b"data: [DONE]" + nl * 2
        kept = b'data: {"choices":[{"text":"a"}]}' + nl * 2 + b"data: [DONE]" + nl * 2
        assert _filtered(*(stream[i:i + 1] for i in range(len(stream)))) == kept


def test_whole_events_pass_at_once_and_only_an_unfinished_one_waits() -> None:
    f = UsageEventFilter()
    assert f.feed(b'data: {"choices":[{"text":"a"}]}\n\ndata: {"cho') == b'data: {"choices":[{"text":"a"}]}\n\n'
    assert f.feed(b'ices":[]}\n\n') == b'data: {"choices":[]}\n\n'  # no usage: kept
    assert f.feed(b"data: [DO") == b"" and f.flush() == b"data: [DO"


def test_usage_at_the_end_of_a_crlf_stream_is_read() -> None:
    tail = b'data: {"choices":[{"text":"a"}]}\r\n\r\n' + USAGE_EVENT + b"\r\n\r\ndata: [DONE]\r\n\r\n"
    assert usage_from_sse_tail(tail) == Usage(prompt_tokens=3, cached_tokens=0)


class SplitUsageBackend:
    """Streams one content event, then the usage event in two writes: the first half with the
    content event, the rest once the client has the content (so the proxy reads it in two)."""

    def __init__(self, newline: bytes) -> None:
        self.newline = newline
        self.client_has_content = asyncio.Event()
        self.url = ""
        self.runner: web.AppRunner | None = None

    async def start(self) -> SplitUsageBackend:
        app = web.Application()
        app.add_routes([web.post("/v1/completions", self.stream), web.get("/health", self.ok),
                        web.get("/v1/models", self.ok)])
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"
        return self

    async def ok(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": []})

    async def stream(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        end = self.newline * 2
        content = b'data: {"choices":[{"index":0,"text":"hi"}]}' + end
        usage = (b'data: {"id":"c","choices":[],"usage":{"prompt_tokens":10,"completion_tokens":1,'
                 b'"prompt_tokens_details":{"cached_tokens":4}}}' + end)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if (body.get("stream_options") or {}).get("include_usage"):
            await resp.write(content + usage[:40])
            await asyncio.wait_for(self.client_has_content.wait(), 30)
            await resp.write(usage[40:] + b"data: [DONE]" + end)
        else:
            await resp.write(content + b"data: [DONE]" + end)
        await resp.write_eof()
        return resp


@pytest.mark.parametrize("newline", [b"\n", b"\r\n"])
async def test_a_usage_event_split_across_reads_or_crlf_framed_never_reaches_a_client_that_did_not_ask(
        proxy_for, newline: bytes) -> None:
    backend = await SplitUsageBackend(newline).start()
    try:
        p = await proxy_for([backend])
        async with aiohttp.ClientSession() as s:
            async with s.post(p.url + "/v1/completions", json={"prompt": "x", "stream": True}) as r:
                first = await r.content.readuntil(newline * 2)
                backend.client_has_content.set()
                rest = await r.read()
        assert first == b'data: {"choices":[{"index":0,"text":"hi"}]}' + newline * 2
        assert rest == b"data: [DONE]" + newline * 2
        assert p.proxy.pool.backends[0].prefill_tokens == 6  # the proxy read the usage it removed
    finally:
        await backend.runner.cleanup()


def test_anthropic_usage_counts_cache_reads_and_writes_as_prompt_and_is_found_in_message_start() -> None:
    whole = b'{"type":"message","usage":{"cache_read_input_tokens":30,"input_tokens":12,"output_tokens":5}}'
    assert usage_from_json(whole) == Usage(prompt_tokens=42, cached_tokens=30, reports_cache=True)
    written = b'{"usage":{"input_tokens":4,"cache_creation_input_tokens":6,"output_tokens":1}}'
    assert usage_from_json(written) == Usage(prompt_tokens=10, cached_tokens=0, reports_cache=False)
    stream = (b'event: message_start\ndata: {"type":"message_start","message":{"usage":'
              b'{"cache_read_input_tokens":3,"input_tokens":9,"output_tokens":0}}}\n\n'
              b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0}\n\n'
              b'event: message_delta\ndata: {"type":"message_delta","usage":{"output_tokens":7}}\n\n'
              b'event: message_stop\ndata: {"type":"message_stop"}\n\n')
    assert usage_from_sse_tail(stream) == Usage(prompt_tokens=12, cached_tokens=3, reports_cache=True)
    assert usage_from_json(b'{"usage":{"input_tokens":"many"}}') is None


@pytest.mark.parametrize("body", [
    b'{"usage":{"prompt_tokens":11,"prompt_tokens_details":{"cached_tokens":4}}}',
    b'{"usage":{"prompt_tokens":11,"prompt_tokens_details":{}},"timings":{"cache_n":7}}',
    b'{"usage":{"prompt_tokens":11,"prompt_tokens_details":{"cached_tokens":null}},"timings":{"cache_n":"7"}}',
    b'{"usage":{"prompt_tokens":11,"prompt_tokens_details":{"cached_tokens":2.0}},"timings":{"cache_n":3}}',
    b'{"usage":{"prompt_tokens":true,"prompt_tokens_details":{"cached_tokens":true}}}',
    b'{"usage":{"prompt_tokens":11,"input_tokens":5}}',
    b'{"usage":{"prompt_tokens":11,"input_tokens":null}}',
    b'{"usage":{"prompt_tokens":11},"type":"message","message":null}',
    b'{"usage":{"prompt_tokens":11,"prompt_tokens_details":5}}',
    b'{"usage":{"prompt_tokens":"11"}}',
    b'{"usage":null}',
    b'{"choices":[]}',
])
def test_the_typed_reading_agrees_with_the_general_one(body: bytes) -> None:
    # The typed decoder reads the common answer; whatever it refuses falls to the general reading,
    # so both must agree on every shape (from the general reading of the same document).
    assert usage_from_json(body) == _usage_of(json.loads(body))
