"""API keys, CORS and the web UI routes of the fake llama-server over real sockets, as llama-server's
pre-routing handler answers them (tools/server/server-http.cpp)."""

from __future__ import annotations

import socket

import aiohttp
import pytest
from multidict import CIMultiDict

from fake_engines.llamacpp.access import AccessPolicy, origin_is_localhost
from fake_engines.llamacpp.config import LlamaServerConfig
from fake_engines.llamacpp.server import bind_hosts, start_llama

KEY = "sk-secret"


def _config(**overrides) -> LlamaServerConfig:
    base = {"model": "llama-3.1-8b-Q4_K_M.gguf", "port": 0, "time_scale": 0.01, "n_parallel": 1, "n_ctx": 512}
    return LlamaServerConfig(**{**base, **overrides})


async def _served(config: LlamaServerConfig, cold_start: bool = False):
    running = await start_llama(config, cold_start=cold_start)
    if not cold_start:
        running.server.ready = True
    return running, f"http://127.0.0.1:{running.port}"


async def _answer(session, method, url, **kw) -> tuple[int, CIMultiDict, str]:
    async with session.request(method, url, **kw) as resp:
        return resp.status, resp.headers.copy(), await resp.text()


PREFLIGHT = {"Origin": "http://web.example", "Access-Control-Request-Method": "POST",
             "Access-Control-Request-Headers": "Authorization"}


async def test_api_key_guards_all_but_health_and_ui_and_accepts_bearer_or_x_api_key():
    running, base = await _served(_config(api_key=f"other,{KEY}"))
    body = {"prompt": "hi", "n_predict": 2}
    try:
        async with aiohttp.ClientSession() as s:
            missing = await _answer(s, "POST", base + "/completion", json=body)
            wrong = await _answer(s, "POST", base + "/completion", json=body, headers={"Authorization": "Bearer no"})
            models = await _answer(s, "GET", base + "/v1/models")
            bearer = await _answer(s, "POST", base + "/completion", json=body,
                                   headers={"Authorization": f"Bearer {KEY}"})
            bare = await _answer(s, "POST", base + "/completion", json=body, headers={"Authorization": KEY})
            anthropic = await _answer(s, "POST", base + "/completion", json=body, headers={"X-Api-Key": KEY})
            public = [(await _answer(s, "GET", base + p))[0]
                      for p in ("/health", "/v1/health", "/", "/sw.js", "/manifest.webmanifest", "/_app/version.json")]
            unknown = await _answer(s, "GET", base + "/nope")
    finally:
        await running.close()
    assert missing[0] == wrong[0] == models[0] == 401
    assert missing[2] == '{"error":{"message":"Invalid API Key","type":"authentication_error","code":401}}'
    assert (bearer[0], bare[0], anthropic[0]) == (200, 200, 200)
    assert public == [200] * 6
    assert unknown[0] == 401  # the key is checked before the route is looked up


async def test_preflight_answers_200_before_key_and_route_with_the_cors_headers():
    running, base = await _served(_config(api_key=KEY))
    try:
        async with aiohttp.ClientSession() as s:
            pre = await _answer(s, "OPTIONS", base + "/completions", headers=PREFLIGHT)
            no_origin = await _answer(s, "GET", base + "/health")
            echoed = await _answer(s, "GET", base + "/health", headers={"Origin": "http://web.example"})
    finally:
        await running.close()
    assert pre[0] == 200 and pre[2] == ""
    assert {k: pre[1][k] for k in pre[1] if k.startswith("Access-Control")} == {
        "Access-Control-Allow-Origin": "http://web.example", "Access-Control-Allow-Credentials": "true",
        "Access-Control-Allow-Methods": "GET, POST, DELETE, OPTIONS", "Access-Control-Allow-Headers": "*"}
    assert no_origin[1]["Access-Control-Allow-Origin"] == ""  # capture llama.cpp/002: an empty echo
    assert echoed[1]["Access-Control-Allow-Origin"] == "http://web.example"
    assert "Access-Control-Allow-Methods" not in echoed[1]


async def test_cors_origins_localhost_reflects_only_localhost_origins():
    running, base = await _served(_config(cors_origins="localhost"))
    try:
        async with aiohttp.ClientSession() as s:
            local = await _answer(s, "OPTIONS", base + "/completions", headers={**PREFLIGHT, "Origin": "http://[::1]:3000"})
            evil = await _answer(s, "OPTIONS", base + "/completions",
                                 headers={**PREFLIGHT, "Origin": "http://localhost.evil.com"})
    finally:
        await running.close()
    assert local[0] == evil[0] == 200
    assert local[1]["Access-Control-Allow-Origin"] == "http://[::1]:3000"
    assert "Access-Control-Allow-Origin" not in evil[1]


@pytest.mark.parametrize(("origin", "local"), [
    ("http://localhost", True), ("https://127.0.0.1:3000", True), ("http://[::1]", True), ("localhost", False),
    ("http://notlocalhost", False), ("http://localhost.evil.com", False), ("ftp://localhost", False),
    ("http://[::1", False)])
def test_origin_is_localhost_by_its_host(origin: str, local: bool):
    assert origin_is_localhost(origin) is local


def test_a_fixed_origin_or_no_credentials_stops_the_echo():
    assert AccessPolicy(cors_origins="https://ui.example").allow_origin("http://evil") == "https://ui.example"
    assert AccessPolicy(cors_credentials=False).allow_origin("http://evil") == "*"
    assert AccessPolicy(cors_credentials=False).preflight_headers()["Access-Control-Allow-Credentials"] == "false"
    assert AccessPolicy.of(_config()).cors_origins == "*"
    assert AccessPolicy.of(_config(server_tools=("all",))).cors_origins == "localhost"
    assert AccessPolicy.of(_config(mcp_servers_json="{}")).cors_origins == "localhost"
    assert AccessPolicy.of(_config(server_tools=("all",), cors_origins="*")).cors_origins == "*"


async def test_api_key_file_adds_keys_and_skips_comments(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("# a comment\nfile-key\n")
    policy = AccessPolicy.of(_config(api_key="flag-key", api_key_file=str(keys)))
    assert policy.api_keys == ("flag-key", "file-key")
    assert not policy.admits("/completion", {"Authorization": "# a comment"})


async def test_ui_is_served_and_no_ui_leaves_only_the_self_removing_worker():
    on, base_on = await _served(_config())
    off, base_off = await _served(_config(no_ui=True))
    try:
        async with aiohttp.ClientSession() as s:
            page = await _answer(s, "GET", base_on + "/")
            again = await _answer(s, "GET", base_on + "/", headers={"If-None-Match": page[1]["ETag"]})
            props_on = await (await s.get(base_on + "/props")).json()
            gone = await _answer(s, "GET", base_off + "/")
            worker = await _answer(s, "GET", base_off + "/sw.js")
            props_off = await (await s.get(base_off + "/props")).json()
    finally:
        await on.close()
        await off.close()
    assert page[0] == 200 and page[2].startswith("<!doctype html>")
    assert page[1]["Cross-Origin-Opener-Policy"] == "same-origin" and page[1]["Cache-Control"] == "no-cache"
    assert again[0] == 304
    assert gone[0] == 404 and '"File Not Found"' in gone[2]
    assert worker[0] == 200 and "unregister()" in worker[2]
    assert (props_on["ui"], props_off["ui"]) == (True, False)


async def test_while_loading_the_ui_answers_and_the_api_is_503():
    running, base = await _served(_config(time_scale=1000.0), cold_start=True)
    try:
        async with aiohttp.ClientSession() as s:
            page = await _answer(s, "GET", base + "/")
            health = await _answer(s, "GET", base + "/health")
            pre = await _answer(s, "OPTIONS", base + "/health", headers=PREFLIGHT)
    finally:
        await running.close()
    assert (page[0], health[0], pre[0]) == (200, 503, 200)


async def test_a_host_list_binds_every_address_and_refuses_port_0():
    with socket.socket(socket.AF_INET6) as probe:
        try:
            probe.bind(("::1", 0))
        except OSError:
            pytest.skip("no IPv6 loopback")
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    running, _ = await _served(_config(host="127.0.0.1, ::1", port=port))
    try:
        async with aiohttp.ClientSession() as s:
            statuses = [(await _answer(s, "GET", f"http://{h}:{port}/health"))[0] for h in ("127.0.0.1", "[::1]")]
    finally:
        await running.close()
    assert statuses == [200, 200]
    with pytest.raises(OSError, match="--port 0 is not supported with multiple TCP addresses"):
        bind_hosts("127.0.0.1,::1", 0)
