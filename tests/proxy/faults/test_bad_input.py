"""Bad input gets an OpenAI-style JSON error and the right status, never a 500 or a traceback."""

from __future__ import annotations

import aiohttp
import pytest

from proxy.http_errors import parse_error_status

JSON = {"Content-Type": "application/json"}
OK_COMPLETION = b'{"model": "tiny-llama", "prompt": "hi", "max_tokens": 2}'

CASES = [
    # (name, path, body, headers, status, param)
    ("malformed json", "/v1/completions", b'{"model": "tiny-llama", "prompt": ', JSON, 400, None),
    ("invalid utf-8", "/v1/completions", b'{"model": "tiny-llama", "prompt": "\xff\xfe"}', JSON, 400, None),
    ("empty body", "/v1/completions", b"", JSON, 400, None),
    ("json array", "/v1/completions", b"[1, 2]", JSON, 400, None),
    ("model not a string", "/v1/completions", b'{"model": 5, "prompt": "hi"}', JSON, 400, "model"),
    ("stream not a boolean", "/v1/completions", b'{"prompt": "hi", "stream": "yes"}', JSON, 400, "stream"),
    ("negative max_tokens", "/v1/completions", b'{"prompt": "hi", "max_tokens": -1}', JSON, 400, "max_tokens"),
    ("prompt an object", "/v1/completions", b'{"prompt": {"a": 1}}', JSON, 400, "prompt"),
    ("missing prompt", "/v1/completions", b'{"model": "tiny-llama"}', JSON, 400, "prompt"),
    ("missing messages", "/v1/chat/completions", b'{"model": "tiny-llama"}', JSON, 400, "messages"),
    ("messages a string", "/v1/chat/completions", b'{"messages": "hi"}', JSON, 400, "messages"),
    ("message without role", "/v1/chat/completions", b'{"messages": [{"content": "hi"}]}', JSON, 400, "messages"),
    ("unknown model", "/v1/completions", b'{"model": "gpt-9", "prompt": "hi"}', JSON, 404, "model"),
    ("wrong content type", "/v1/completions", OK_COMPLETION, {"Content-Type": "text/plain"}, 415, None),
    ("body over the limit", "/v1/completions", b'{"prompt": "' + b"x" * 5000 + b'"}', JSON, 413, None),
    ("oversized header", "/v1/completions", OK_COMPLETION, {**JSON, "X-Big": "y" * 10_000}, 431, None),
    ("wrong method", "/health", b"", {}, 405, None),
]


@pytest.fixture
async def proxy_url(fake_backend, proxy_for):
    b = await fake_backend()
    p = await proxy_for([b], max_body_bytes=4096)
    return p.url


@pytest.mark.parametrize(("name", "path", "body", "headers", "status", "param"), CASES, ids=[c[0] for c in CASES])
async def test_bad_input_gets_an_openai_error_with_the_right_status(proxy_url, name, path, body, headers, status,
                                                                    param):
    async with aiohttp.ClientSession() as s:
        async with s.post(proxy_url + path, data=body, headers=headers) as r:
            text = await r.text()
            assert r.status == status, text
            assert r.content_type == "application/json"
            error = (await r.json())["error"]
    assert error["message"] and error["type"].endswith("_error")
    assert error["param"] == param
    assert "Traceback" not in text


async def test_the_proxy_still_serves_after_every_bad_request(proxy_url):
    async with aiohttp.ClientSession() as s:
        for _, path, body, headers, _, _ in CASES:
            async with s.post(proxy_url + path, data=body, headers=headers) as r:
                await r.read()
        async with s.post(proxy_url + "/v1/completions", data=OK_COMPLETION, headers=JSON) as r:
            assert r.status == 200


def test_a_too_long_request_line_stays_a_400():
    from aiohttp.http_exceptions import LineTooLong

    assert parse_error_status(400, LineTooLong("request line", "8190", "9000")) == 400
    assert parse_error_status(400, LineTooLong("header field", "8190", "9000")) == 431
