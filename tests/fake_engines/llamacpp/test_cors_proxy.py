"""/cors-proxy of the fake llama-server over real sockets, against a local target server."""

from __future__ import annotations

import socket

import aiohttp
import pytest
from aiohttp import web

from fake_engines.llamacpp.config import LlamaServerConfig
from fake_engines.llamacpp.cors_proxy import parse_target
from fake_engines.llamacpp.errors import LlamaError
from fake_engines.llamacpp.server import start_llama

KEY = "sk-proxy"


async def _target() -> tuple[web.AppRunner, str, list[dict]]:
    """A local server that records what reached it: GET answers JSON with extra headers, POST 204."""
    seen: list[dict] = []

    async def record(request: web.Request) -> web.Response:
        seen.append({"method": request.method, "path": request.path_qs, "headers": dict(request.headers),
                     "body": await request.text()})
        if request.method == "POST":
            return web.Response(status=204)
        return web.json_response({"ok": True}, status=201, headers={
            "X-Target": "yes", "Access-Control-Allow-Origin": "https://target.example", "Set-Cookie": "t=1"})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", record)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}", seen


async def _llama(**overrides):
    config = LlamaServerConfig(**{"model": "llama-3.1-8b-Q4_K_M.gguf", "port": 0, "time_scale": 0.01,
                                  "n_parallel": 1, "n_ctx": 512, **overrides})
    running = await start_llama(config, cold_start=False)
    running.server.ready = True
    return running, f"http://127.0.0.1:{running.port}"


async def test_cors_proxy_is_403_unless_enabled():
    running, base = await _llama()
    try:
        async with aiohttp.ClientSession() as s:
            async with s.get(base + "/cors-proxy?url=http://127.0.0.1:1/") as resp:
                status, body = resp.status, await resp.json()
            async with s.get(base + "/props") as resp:
                enabled = (await resp.json())["cors_proxy_enabled"]
    finally:
        await running.close()
    assert status == 403 and not enabled
    assert body == {"error": {"message": "this feature is disabled", "type": "feature_disabled"}}


async def test_cors_proxy_forwards_only_the_named_headers_and_relays_the_answer():
    target, target_url, seen = await _target()
    running, base = await _llama(ui_mcp_proxy=True, api_key=KEY)
    try:
        async with aiohttp.ClientSession() as s:
            async with s.get(base + "/cors-proxy", params={"url": target_url + "/mcp?x=1"}) as resp:
                without_key = resp.status
            async with s.get(base + "/cors-proxy", params={"url": target_url + "/mcp?x=1"}, headers={
                    "Authorization": f"Bearer {KEY}", "Cookie": "session=secret", "Proxy-Authorization": "Basic s",
                    "x-llama-server-proxy-header-accept": "application/json",
                    "x-llama-server-proxy-header-authorization": "Bearer explicit",
                    "x-llama-server-proxy-header-accept-encoding": "gzip"}) as resp:
                got = (resp.status, resp.headers.copy(), await resp.json())
            async with s.post(base + "/cors-proxy", params={"url": target_url + "/"}, data=b'{"a":1}',
                              headers={"X-Api-Key": KEY}) as resp:
                no_content = (resp.status, await resp.read())
    finally:
        await running.close()
        await target.cleanup()
    assert without_key == 401 and len(seen) == 2
    status, headers, body = got
    assert (status, body, headers["X-Target"], headers["Set-Cookie"]) == (201, {"ok": True}, "yes", "t=1")
    assert headers["Content-Type"].startswith("application/json") and headers["Server"] == "llama.cpp"
    assert headers["Access-Control-Allow-Origin"] == ""  # this server's own CORS, not the target's
    sent = {k.lower(): v for k, v in seen[0]["headers"].items()}
    assert seen[0]["path"] == "/mcp?x=1"
    assert (sent["accept"], sent["authorization"]) == ("application/json", "Bearer explicit")
    assert not {"cookie", "proxy-authorization", "x-api-key", "accept-encoding"} & set(sent)
    assert no_content == (204, b"") and seen[1]["method"] == "POST" and seen[1]["body"] == '{"a":1}'


async def test_cors_proxy_refuses_bad_targets_and_reports_an_unreachable_one():
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        dead = free.getsockname()[1]
    running, base = await _llama(ui_mcp_proxy=True)
    answers = []
    try:
        async with aiohttp.ClientSession() as s:
            for url in ("", "file:///etc/passwd", "http://u:pw@127.0.0.1/", f"http://127.0.0.1:{dead}/"):
                async with s.get(base + "/cors-proxy", params={"url": url}) as resp:
                    answers.append((resp.status, await resp.text()))
    finally:
        await running.close()
    assert [a[0] for a in answers] == [500, 500, 500, 500]
    assert '"message":"invalid URL: no scheme"' in answers[0][1]
    assert '"message":"unsupported URL scheme: file"' in answers[1][1]
    assert '"message":"authentication in target URL is not supported"' in answers[2][1]
    assert answers[3][1] == "proxy error: Could not establish connection"


@pytest.mark.parametrize(("url", "parts"), [
    ("http://example.com", ("example.com", 80, "/")),
    ("https://[::1]:8443/a/b?c=d", ("::1", 8443, "/a/b?c=d")),
    ("http://user@h:81/x", ("h", 81, "/x")),
])
def test_target_urls_parse_as_llama_cpp_parses_them(url, parts):
    target = parse_target(url)
    assert (target.host, target.port, target.path) == parts


@pytest.mark.parametrize(("url", "status", "message"), [
    ("http://", 500, "invalid target URL: missing host"), ("http://[::1/", 500, "invalid IPv6 URL authority: [::1"),
    ("http://h:port/", 400, "stoi")])
def test_malformed_target_urls_are_refused_with_llama_cpps_words(url, status, message):
    with pytest.raises(LlamaError) as err:
        parse_target(url)
    assert (err.value.status, err.value.message) == (status, message)
