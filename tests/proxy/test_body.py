"""Compressed request bodies: decoded within the body limit and forwarded decoded (without
Content-Encoding), or refused with 415 / 413 / 400; never a 500, never a backend blamed."""

from __future__ import annotations

import gzip
import json
import logging
import zlib

import aiohttp
import pytest

from fake_engines.vllm.config import VllmServeConfig
from fake_engines.vllm.server import start_vllm
from policies.routing.base import BackendState
from proxy.body import codings, decode
from proxy.config import BackendSpec, BreakerConfig
from proxy.errors import ProxyError
from tests.proxy.conftest import BackendFactory, ProxyFactory

BODY = json.dumps({"model": "tiny-llama", "prompt": "tell me a story", "max_tokens": 4}).encode()


def raw_deflate(data: bytes) -> bytes:
    c = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return c.compress(data) + c.flush()


def test_gzip_zlib_deflate_raw_deflate_and_several_gzip_members_decode() -> None:
    assert decode(gzip.compress(BODY), "gzip", 1 << 20) == BODY
    assert decode(gzip.compress(BODY), "x-gzip", 1 << 20) == BODY
    assert decode(zlib.compress(BODY), "deflate", 1 << 20) == BODY
    assert decode(raw_deflate(BODY), "deflate", 1 << 20) == BODY
    assert decode(gzip.compress(BODY[:10]) + gzip.compress(BODY[10:]), "gzip", 1 << 20) == BODY


@pytest.mark.parametrize("data,status", [
    (gzip.compress(b"\0" * (10 << 20)), 413),  # a 10 KiB bomb of 10 MiB
    (gzip.compress(BODY)[:-12], 400),  # cut short
    (b"not gzip at all", 400),
    (gzip.compress(BODY) + b"trailing junk", 400),
], ids=["bomb", "cut short", "not gzip", "trailing junk"])
def test_bombs_and_corrupt_bodies_are_refused_while_decoding(data: bytes, status: int) -> None:
    with pytest.raises(ProxyError) as exc:
        decode(data, "gzip", 64 * 1024)
    assert exc.value.status == status


def test_codings_are_listed_in_order_lowercase_without_identity() -> None:
    assert codings(["GZIP"]) == ["gzip"]
    assert codings(["identity", "deflate, gzip"]) == ["deflate", "gzip"]
    assert codings([]) == [] and codings([""]) == []


async def post(url: str, data: bytes, encoding: str) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as s:
        async with s.post(url + "/v1/completions", data=data, headers={
                "Content-Type": "application/json", "Content-Encoding": encoding}) as r:
            return r.status, await r.json(content_type=None)


async def test_a_gzip_body_reaches_the_engine_decoded_without_content_encoding(
        fake_backend: BackendFactory, proxy_for: ProxyFactory) -> None:
    b = await fake_backend()
    p = await proxy_for([b])
    for data, encoding in [(gzip.compress(BODY), "gzip"), (zlib.compress(BODY), "deflate"),
                           (raw_deflate(BODY), "Deflate"), (BODY, "identity")]:
        status, answer = await post(p.url, data, encoding)
        assert status == 200 and answer["choices"], encoding
    for headers in b.request_headers:
        assert "Content-Encoding" not in headers
        assert headers["Content-Length"] == str(len(BODY))


@pytest.mark.parametrize("data,encoding,status", [
    (b"\x1b\x00", "br", 415), (b"(\xb5/\xfd", "zstd", 415), (b"x", "compress", 415), (BODY, "gzip, br", 415),
    (gzip.compress(b"\0" * (10 << 20)), "gzip", 413),
    (gzip.compress(BODY)[:-12], "gzip", 400), (b"not gzip", "gzip", 400),
], ids=["br", "zstd", "compress", "gzip then br", "bomb", "cut short", "not gzip"])
async def test_unsupported_bombs_and_corrupt_bodies_get_the_proxys_error_and_no_traceback(
        fake_backend: BackendFactory, proxy_for: ProxyFactory, caplog: pytest.LogCaptureFixture,
        data: bytes, encoding: str, status: int) -> None:
    b = await fake_backend()
    p = await proxy_for([b], max_body_bytes=64 * 1024)
    with caplog.at_level(logging.DEBUG):
        got, answer = await post(p.url, data, encoding)
    assert got == status and answer["error"]["type"] == "invalid_request_error"
    assert b.received == 0
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]


async def test_gzip_bodies_no_longer_eject_look_alike_vllm_engines(proxy_for: ProxyFactory) -> None:
    engines = []
    try:
        for _ in range(2):
            config = VllmServeConfig(model="llama-3.1-8b", served_model_name="tiny-llama", port=0,
                                     time_scale=0.01, max_model_len=4096)
            engines.append(await start_vllm(config, cold_start=False))
            await engines[-1].wait_ready()
        p = await proxy_for([BackendSpec(f"http://127.0.0.1:{e.port}", "vllm") for e in engines],
                            breaker=BreakerConfig(failure_threshold=2, success_threshold=1, open_s=60.0))
        results = [await post(p.url, gzip.compress(BODY), "gzip") for _ in range(12)]
        assert [status for status, _ in results] == [200] * 12
        assert all(b.state is BackendState.READY for b in p.proxy.pool)
        async with aiohttp.ClientSession() as s, s.get(p.url + "/ready") as r:
            assert r.status == 200 and (await r.json())["ready_backends"] == 2
    finally:
        for e in engines:
            await e.close()
