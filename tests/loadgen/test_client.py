import asyncio
import json
import time

import aiohttp
import pytest
from aiohttp import web

from loadgen.client import stream_request
from loadgen.results import RequestRecord


async def _timed_stream(request: web.Request) -> web.StreamResponse:
    """First token after 0.3 s, two more 0.2 s apart; chat deltas; usage with cached tokens."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "x-flotilla-backend": "r7"})
    await resp.prepare(request)
    await resp.write(b'data: {"choices":[{"delta":{"role":"assistant"}}]}\n\n')  # no text: not a token
    for delay in (0.3, 0.2, 0.2):
        await asyncio.sleep(delay)
        await resp.write(b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}],"usage":null}\n\n')
    usage = {"prompt_tokens": 9, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 4}}
    await resp.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\ndata: [DONE]\n\n".encode())
    return resp


async def _bad_request(request: web.Request) -> web.Response:
    return web.json_response({"error": {"message": "max_tokens must be at least 1", "code": 400}}, status=400)


async def _error_mid_stream(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(b'data: {"choices":[{"index":0,"text":"a"}]}\n\n')
    await resp.write(b'data: {"error":{"message":"engine dead","type":"InternalServerError","code":500}}\n\n')
    await resp.write(b"data: [DONE]\n\n")
    return resp


@pytest.fixture
async def client_and_url(aiohttp_server):
    app = web.Application()
    app.router.add_post("/stream", _timed_stream)
    app.router.add_post("/bad", _bad_request)
    app.router.add_post("/dies", _error_mid_stream)
    server = await aiohttp_server(app, host="127.0.0.1")
    async with aiohttp.ClientSession() as session:
        yield session, f"http://127.0.0.1:{server.port}"


async def test_ttft_itl_and_tpot_follow_benchmark_serving_definitions(client_and_url):
    session, url = client_and_url
    rec = RequestRecord(index=0, send_time_s=time.perf_counter())
    await stream_request(session, url + "/stream", {}, rec, time.perf_counter)
    assert rec.ok and rec.error is None and rec.backend == "r7"
    assert (rec.prompt_tokens, rec.completion_tokens, rec.cached_tokens) == (9, 3, 4)
    assert rec.ttft_s == pytest.approx(0.3, abs=0.1)
    assert len(rec.itl_s) == 2 and all(gap == pytest.approx(0.2, abs=0.1) for gap in rec.itl_s)
    assert rec.tpot_s == pytest.approx((rec.e2e_s - rec.ttft_s) / 2)
    assert rec.ttft_s + sum(rec.itl_s) <= rec.e2e_s


async def test_an_http_error_is_recorded_with_status_and_message(client_and_url):
    session, url = client_and_url
    rec = await stream_request(session, url + "/bad", {}, RequestRecord(index=0), time.perf_counter)
    assert not rec.ok and rec.error == "HTTP 400: max_tokens must be at least 1"
    assert rec.ttft_s is None and rec.completion_tokens == 0


async def test_without_a_usage_chunk_streamed_text_chunks_are_counted(sse_server):
    url, _ = sse_server
    async with aiohttp.ClientSession() as session:
        rec = RequestRecord(index=0, send_time_s=time.perf_counter())
        # the test server always sends usage; a plain completions body proves the counting path matches it
        await stream_request(session, url + "/v1/completions", {"prompt": "abcdefgh", "max_tokens": 5},
                             rec, time.perf_counter)
    assert rec.ok and rec.completion_tokens == 5 == len(rec.itl_s) + 1 and rec.prompt_tokens == 2


async def test_an_error_event_after_the_200_fails_the_request_with_its_message(client_and_url):
    session, url = client_and_url
    rec = await stream_request(session, url + "/dies", {}, RequestRecord(index=0), time.perf_counter)
    assert not rec.ok and rec.error == "stream error: engine dead"
    assert rec.ttft_s is not None  # the token before the failure was still timed
