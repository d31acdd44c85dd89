"""Client API keys, per-key rate limits, the admin token on every admin route, the default bind
address, and the allow-list for backends registered through the admin API."""

from __future__ import annotations

import argparse
import asyncio

import aiohttp
import pytest

from flotilla.proxy_cmd import add_arguments, build_config
from proxy.access import address_allowed, check_backend_url
from proxy.errors import ProxyError
from proxy.limits import LimitsConfig, read_keys_file

BODY = {"model": "tiny-llama", "prompt": "hi", "max_tokens": 2}
TOKEN = "admin-secret"


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(["--backend", "http://127.0.0.1:9", *argv])


async def test_with_api_keys_v1_needs_a_valid_bearer_key_and_health_stays_open(fake_backend, proxy_for):
    b = await fake_backend()
    p = await proxy_for([b], limits=LimitsConfig(api_keys=("k1", "k2")))
    async with aiohttp.ClientSession() as s:
        for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "Basic k1"}):
            async with s.post(p.url + "/v1/completions", json=BODY, headers=headers) as r:
                assert r.status == 401
                assert (await r.json())["error"]["type"] == "authentication_error"
        for key in ("k1", "k2"):
            async with s.post(p.url + "/v1/completions", json=BODY, headers={"Authorization": f"Bearer {key}"}) as r:
                assert r.status == 200
        async with s.get(p.url + "/health") as r:
            assert r.status == 200


async def test_a_key_over_its_rate_gets_429_with_retry_after_and_other_keys_are_unaffected(fake_backend, proxy_for):
    b = await fake_backend()
    p = await proxy_for([b], limits=LimitsConfig(api_keys=("k1", "k2"), rate_limit_rps=0.5, rate_limit_burst=2))
    async with aiohttp.ClientSession() as s:
        statuses = []
        for _ in range(3):
            async with s.post(p.url + "/v1/completions", json=BODY, headers={"Authorization": "Bearer k1"}) as r:
                statuses.append(r.status)
                retry_after = r.headers.get("Retry-After")
        assert statuses == [200, 200, 429]
        assert retry_after == "2"  # one token at 0.5/s
        async with s.post(p.url + "/v1/completions", json=BODY, headers={"Authorization": "Bearer k2"}) as r:
            assert r.status == 200


def test_keys_file_skips_blank_lines_and_comments(tmp_path):
    path = tmp_path / "keys"
    path.write_text("alpha\n\n# retired: beta\ngamma  # ops team\n")
    assert read_keys_file(path) == ("alpha", "gamma")
    config = build_config(_args("--api-key", "delta", "--api-keys-file", str(path)))
    assert config.limits.api_keys == ("delta", "alpha", "gamma")


def test_the_default_bind_address_is_loopback_and_backends_default_to_loopback_networks():
    config = build_config(_args())
    assert config.host == "127.0.0.1"
    assert config.limits.backend_networks == ("127.0.0.0/8", "::1/128")


async def test_a_proxy_started_with_defaults_listens_on_127_0_0_1_only(fake_backend, proxy_for):
    b = await fake_backend()
    p = await proxy_for([b])
    assert [addr[0] for addr in p.runner.addresses] == ["127.0.0.1"]


async def test_every_admin_route_needs_the_token(fake_backend, proxy_for):
    b = await fake_backend()
    p = await proxy_for([b], admin_token=TOKEN)
    admin = sorted({(r.method, r.resource.canonical) for r in p.app.router.routes()
                    if r.resource is not None and r.resource.canonical.startswith("/admin")})
    assert ("GET", "/admin/debug") in admin and ("POST", "/admin/backends") in admin
    async with aiohttp.ClientSession() as s:
        for method, path in admin:
            for headers in ({}, {"Authorization": "Bearer wrong"}):
                async with s.request(method, p.url + path, json={"url": b.url}, headers=headers) as r:
                    assert r.status == 401, (method, path)
            async with s.request(method, p.url + path) as r:
                assert r.status in (401, 403)


async def test_without_an_admin_token_the_admin_api_is_disabled(fake_backend, proxy_for):
    b = await fake_backend()
    p = await proxy_for([b])
    async with aiohttp.ClientSession() as s, s.get(p.url + "/admin/backends") as r:
        assert r.status == 403


async def test_admin_may_register_loopback_backends_only_by_default(fake_backend, proxy_for):
    b = await fake_backend()
    p = await proxy_for([b], admin_token=TOKEN)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with aiohttp.ClientSession() as s:
        for url in ("http://10.0.0.7:8000", "http://169.254.169.254", "http://[2001:db8::1]:80"):
            async with s.post(p.url + "/admin/backends", json={"url": url}, headers=auth) as r:
                assert r.status == 403, url
                body = await r.json()
                assert body["error"]["type"] == "permission_error" and body["error"]["param"] == "url"
        for url in ("http://127.0.0.1:9", "http://localhost:10"):
            async with s.post(p.url + "/admin/backends", json={"url": url}, headers=auth) as r:
                assert r.status == 201, url
    assert len(p.proxy.pool) == 3


async def test_the_allow_list_takes_other_networks_when_configured():
    nets = LimitsConfig(backend_networks=("10.0.0.0/8",)).networks
    await check_backend_url("http://10.1.2.3:8000", nets)
    with pytest.raises(ProxyError) as err:
        await check_backend_url("http://127.0.0.1:8000", nets)
    assert err.value.status == 403
    assert address_allowed("::ffff:10.0.0.1", nets)


async def test_wrong_key_guesses_past_the_burst_get_429_from_that_address_only(fake_backend, proxy_for):
    b = await fake_backend()
    p = await proxy_for([b], limits=LimitsConfig(api_keys=("right",), rate_limit_rps=1.0, rate_limit_burst=5))
    loop = asyncio.get_running_loop()
    started = loop.time()
    statuses = []
    async with aiohttp.ClientSession() as s:
        for i in range(200):
            async with s.post(p.url + "/v1/completions", json=BODY, headers={"Authorization": f"Bearer guess{i}"}) as r:
                statuses.append(r.status)
                if r.status == 429:
                    limited = r.headers["Retry-After"], (await r.json())["error"]["code"]
        refilled = int(loop.time() - started) + 1  # tokens back at 1/s while guessing
        # While the address is limited even the right key gets 429: guessing cannot find it.
        async with s.post(p.url + "/v1/completions", json=BODY, headers={"Authorization": "Bearer right"}) as r:
            right_key_status = r.status
    assert statuses[:5] == [401] * 5 and set(statuses) == {401, 429}
    assert statuses.count(429) >= 200 - 5 - refilled
    assert limited == ("1", "rate_limit_exceeded")
    assert right_key_status == 429
    # Another address with the right key is served.
    connector = aiohttp.TCPConnector(local_addr=("127.0.0.2", 0))
    async with aiohttp.ClientSession(connector=connector) as s, \
            s.post(p.url + "/v1/completions", json=BODY, headers={"Authorization": "Bearer right"}) as r:
        assert r.status == 200


async def test_a_key_with_bytes_that_are_not_utf8_is_401_not_500(fake_backend, proxy_for):
    b = await fake_backend()
    p = await proxy_for([b], limits=LimitsConfig(api_keys=("k1",)), admin_token=TOKEN)
    for path, method in (("/v1/completions", "POST"), ("/admin/backends", "GET")):
        reader, writer = await asyncio.open_connection("127.0.0.1", p.port)
        writer.write(f"{method} {path} HTTP/1.1\r\nHost: p\r\nContent-Length: 2\r\nConnection: close\r\n".encode()
                     + b"Authorization: Bearer \xff\xfe\x80\r\n\r\n{}")
        answer = await asyncio.wait_for(reader.read(), 30)
        writer.close()
        assert answer.startswith(b"HTTP/1.1 401 "), answer


async def test_anthropic_clients_key_in_x_api_key_is_checked_and_never_forwarded(fake_backend, proxy_for):
    b = await fake_backend()
    p = await proxy_for([b], limits=LimitsConfig(api_keys=("k1",)))
    body = {"model": "tiny-llama", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    async with aiohttp.ClientSession() as s:
        async with s.post(p.url + "/v1/messages", json=body, headers={"x-api-key": "nope"}) as r:
            assert r.status == 401
            err = await r.json()
            assert err["type"] == "error" and err["error"]["type"] == "authentication_error"
        async with s.post(p.url + "/v1/messages", json=body, headers={"x-api-key": "k1"}) as r:
            assert r.status == 200
        async with s.post(p.url + "/v1/completions", json=BODY, headers={"X-Api-Key": "k1"}) as r:
            assert r.status == 200
    assert b.received == 2
    assert all("x-api-key" not in h and "authorization" not in h for h in b.request_headers)
