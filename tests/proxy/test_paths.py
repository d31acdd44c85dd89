"""Only the allow-listed OpenAI routes reach an engine: path tricks get the proxy's own 404, a
served path with another method its 405, and an engine's private routes stay out of reach."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import aiohttp
import pytest

from fake_engines.driver.faults import FaultInjector
from fake_engines.vllm.config import VllmServeConfig
from fake_engines.vllm.server import start_vllm
from proxy.config import BackendSpec
from proxy.paths import path_problem
from tests.proxy.conftest import BackendFactory, ProxyFactory

CANONICAL = ["/v1/completions", "/v1/chat/completions", "/v1/%63ompletions", "/health", "/", "/v1/models/",
             "/v1/a.b/..c/c..", "/admin/backends"]
TRICKS = [
    "/v1/../admin/faults", "/v1/%2e%2e/admin/faults", "/v1/%2E%2E%2Fadmin/faults", "/v1/..%2fadmin/faults",
    "/v1/%2e%2e%5cadmin/faults", "/v1/.%2e/admin/faults", "/v1/./../admin/faults", "/v1//../admin/faults",
    "//admin/faults", "/v1\\..\\admin\\faults", "/v1/..;x=1/admin/faults", "/v1/%252e%252e/admin/faults",
    "/v1/%00/../admin/faults", "/v1/%ff/../admin/faults", "/v1/%zz/../admin/faults", "/v1/..",
    "/v1/./completions", "/v1//completions", "//v1/completions", "/v1/completions;x=1", "/v1%2fcompletions",
    "/v1/%0d%0aX-Injected:%201",
]
CRASH = json.dumps({"exit_at_s": 0}).encode()


@pytest.mark.parametrize("path", CANONICAL)
def test_canonical_paths_have_no_problem(path: str) -> None:
    assert path_problem(path) is None


@pytest.mark.parametrize("path", [*TRICKS, "relative/v1/completions", "/v1/\u00e9"])
def test_dot_segments_encoded_delimiters_and_odd_bytes_are_refused(path: str) -> None:
    assert path_problem(path) is not None


async def raw_request(url: str, method: str, target: str, body: bytes = b"",
                      headers: str = "") -> tuple[int, dict[str, str], bytes]:
    """One request whose target is sent byte for byte (an HTTP client would normalise it first)."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(f"{method} {target} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{headers}"
                     f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
        data = await asyncio.wait_for(reader.read(), 30)
    finally:
        writer.close()
    head, _, payload = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    fields = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
    return int(lines[0].split()[1]), {k.lower(): v for k, v in fields.items()}, payload


@pytest.fixture
async def vllm_engines() -> AsyncIterator[list[tuple[BackendSpec, FaultInjector]]]:
    """Two look-alike vLLM engines with their fault-injection admin route (the probe's target)."""
    started = []
    try:
        for _ in range(2):
            config = VllmServeConfig(model="llama-3.1-8b", served_model_name="tiny-llama", port=0, time_scale=0.01,
                                     max_model_len=4096)
            injector = FaultInjector()
            running = await start_vllm(config, cold_start=False, faults=injector)
            started.append((running, injector))
            await running.wait_ready()
        yield [(BackendSpec(f"http://127.0.0.1:{r.port}", "vllm"), injector) for r, injector in started]
    finally:
        for running, _ in started:
            await running.close()


async def test_no_path_trick_reaches_an_engine_admin_route_and_both_engines_keep_serving(
        vllm_engines, proxy_for: ProxyFactory) -> None:
    p = await proxy_for([spec for spec, _ in vllm_engines])
    for target in [*TRICKS, "/admin/faults"]:
        status, headers, payload = await raw_request(p.url, "POST", target, CRASH)
        assert status == 404, target
        assert json.loads(payload)["error"]["type"] == "not_found_error", target
        assert headers["x-flotilla-backend"] == "", target
    async with aiohttp.ClientSession() as s:
        for spec, injector in vllm_engines:
            assert not injector.crashed
            async with s.get(spec.url + "/admin/faults") as r:
                seen = await r.json()
            assert seen["exit_at_s"] is None and seen["generation_requests"] == 0
        async with s.post(p.url + "/v1/completions", json={"model": "tiny-llama", "prompt": "hi", "max_tokens": 2}) as r:
            assert r.status == 200


async def test_engine_private_routes_are_the_proxys_404_and_its_metrics_are_its_own(
        vllm_engines, proxy_for: ProxyFactory) -> None:
    p = await proxy_for([spec for spec, _ in vllm_engines])
    for target in ["/v1/../version", "/v1/../metrics", "/version", "/v1/load_lora_adapter",
                   "/v1/unload_lora_adapter", "/tokenize", "/pooling", "/score", "/ping", "/load", "/v1/models/x"]:
        for method in ("GET", "POST"):
            status, headers, payload = await raw_request(p.url, method, target, b"{}")
            assert status in (404, 405) and headers["x-flotilla-backend"] == "", (method, target)
            assert "error" in json.loads(payload)
    status, _, payload = await raw_request(p.url, "GET", "/metrics")
    assert status == 200 and b"flotilla_requests" in payload and b"vllm:" not in payload


async def test_a_served_path_with_another_method_is_405_with_allow(fake_backend: BackendFactory,
                                                                   proxy_for: ProxyFactory) -> None:
    b = await fake_backend()
    p = await proxy_for([b])
    async with aiohttp.ClientSession() as s:
        for method, path in [("GET", "/v1/completions"), ("PUT", "/v1/completions"),
                             ("DELETE", "/v1/chat/completions"), ("POST", "/v1/models")]:
            async with s.request(method, p.url + path, data=b"{}") as r:
                body = await r.json()
                assert r.status == 405, (method, path)
                assert r.headers["Allow"] in ("POST", "GET,HEAD", "HEAD,GET"), (method, path)
                assert r.headers["x-flotilla-backend"] == ""
                assert body["error"]["type"] == "invalid_request_error"
    assert b.received == 0


async def test_a_percent_encoded_letter_is_served_and_the_engine_gets_the_routes_own_path(
        fake_backend: BackendFactory, proxy_for: ProxyFactory) -> None:
    b = await fake_backend()
    p = await proxy_for([b])
    status, headers, _ = await raw_request(p.url, "POST", "/v1/%63ompletions?x=a%26b",
                                           b'{"model": "tiny-llama", "prompt": "hi"}')
    assert status == 200 and headers["x-flotilla-backend"] == b.url
    assert b.targets == ["/v1/completions?x=a%26b"]
