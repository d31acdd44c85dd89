import aiohttp

from tests.proxy.conftest import BackendFactory, ProxyFactory

TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


async def test_admin_api_is_disabled_without_a_token(fake_backend: BackendFactory, proxy_for: ProxyFactory) -> None:
    b = await fake_backend()
    p = await proxy_for([b])
    async with aiohttp.ClientSession() as s:
        async with s.post(p.url + "/admin/backends", json={"url": "http://127.0.0.1:1"}, headers=AUTH) as r:
            assert r.status == 403 and (await r.json())["error"]["type"] == "permission_error"
    assert len(p.proxy.pool) == 1


async def test_admin_api_needs_the_right_bearer_token(fake_backend: BackendFactory, proxy_for: ProxyFactory) -> None:
    b = await fake_backend()
    p = await proxy_for([b], admin_token=TOKEN)
    async with aiohttp.ClientSession() as s:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"}):
            async with s.get(p.url + "/admin/backends", headers=headers) as r:
                assert r.status == 401 and r.headers["WWW-Authenticate"] == "Bearer"
        async with s.delete(p.url + "/admin/backends", params={"url": b.url}) as r:
            assert r.status == 401
    assert len(p.proxy.pool) == 1


async def test_added_backend_takes_traffic_and_removed_one_drains_out(
        fake_backend: BackendFactory, proxy_for: ProxyFactory) -> None:
    first = await fake_backend("first")
    second = await fake_backend("second")
    p = await proxy_for([first], admin_token=TOKEN, policy="round-robin")
    body = {"model": "tiny-llama", "prompt": "x"}
    async with aiohttp.ClientSession() as s:
        async with s.post(p.url + "/admin/backends", headers=AUTH,
                          json={"url": second.url, "flavor": "vllm", "weight": 2}) as r:
            assert r.status == 201
            added = await r.json()
        assert (added["state"], added["flavor"], added["weight"], added["source"]) == ("ready", "vllm", 2.0, "admin")
        seen = set()
        for _ in range(4):
            async with s.post(p.url + "/v1/completions", json=body) as r:
                seen.add(r.headers["x-flotilla-backend"])
        assert seen == {first.url, second.url}
        async with s.delete(p.url + "/admin/backends", headers=AUTH, params={"url": first.url}) as r:
            assert r.status == 200
        for _ in range(3):
            async with s.post(p.url + "/v1/completions", json=body) as r:
                assert r.headers["x-flotilla-backend"] == second.url
        async with s.get(p.url + "/admin/backends", headers=AUTH) as r:
            assert [x["url"] for x in (await r.json())["backends"]] == [second.url]
        async with s.post(p.url + "/admin/backends", headers=AUTH, json={"url": "ftp://x"}) as r:
            assert r.status == 400 and (await r.json())["error"]["param"] == "url"
        async with s.delete(p.url + "/admin/backends", headers=AUTH, json={"url": "http://127.0.0.1:9"}) as r:
            assert r.status == 404


async def test_a_new_backend_of_the_wrong_shape_is_400_naming_the_field(
        fake_backend: BackendFactory, proxy_for: ProxyFactory) -> None:
    b = await fake_backend()
    p = await proxy_for([b], admin_token=TOKEN)
    url = "http://127.0.0.1:9"
    cases = [
        (b'{"url": "%s", "weight": "x"}' % url.encode(), "weight"),
        (b'{"url": "%s", "weight": 1e400}' % url.encode(), "weight"),  # parses as infinity
        (b'{"url": "%s", "weight": NaN}' % url.encode(), "weight"),
        (b'{"url": "%s", "weight": true}' % url.encode(), "weight"),
        (b'{"url": "%s", "weight": 1%s}' % (url.encode(), b"0" * 400), "weight"),  # float() would overflow
        (b'{"url": "%s", "models": [1, 2]}' % url.encode(), "models"),
        (b'{"url": "%s", "flavor": 3}' % url.encode(), "flavor"),
        (b'{"url": 5}', "url"),
        (b'{"url": "http://[::1"}', "url"),
    ]
    async with aiohttp.ClientSession() as s:
        for body, param in cases:
            async with s.post(p.url + "/admin/backends", data=body, headers=AUTH) as r:
                assert r.status == 400, body
                assert (await r.json())["error"]["param"] == param, body
        nested = b'{"url": ' + b"[" * 5000 + b"]" * 5000 + b"}"
        async with s.post(p.url + "/admin/backends", data=nested, headers=AUTH) as r:
            assert r.status == 400
    assert len(p.proxy.pool) == 1
