"""Backends discovered through a Service's EndpointSlices: the pool follows the recorded API
responses (a list, then watch events adding and removing endpoints), and a proxy routes to the
pods it found."""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp
import pytest

from policies.routing.base import BackendState
from proxy.app import start_proxy
from proxy.config import BackendSpec, ConfigError, ProxyConfig
from proxy.discovery import DiscoverSpec, ServiceDiscovery, attach, file_specs, parse_discover_arg
from proxy.pool import BackendPool
from tests.proxy.conftest import FakeBackend
from tests.proxy.kube_api import SLICES, FakeApiServer, endpoint, endpoint_slice, serve
from tests.waiting import wait_until


@pytest.fixture
async def api(tmp_path):
    fake = FakeApiServer()
    fake.slices["llama"] = [llama_slice(endpoint("llama-5c-a", "10.0.1.21"), name="llama-x1")]
    runner, kubeconfig = await serve(fake, tmp_path)
    yield fake, kubeconfig
    await runner.cleanup()


def llama_slice(*endpoints: dict, name: str) -> dict:
    return endpoint_slice(*endpoints, name=name, service="llama", port=8080)


def urls(pool: BackendPool, source: str = "k8s:llama") -> list[str]:
    return sorted(b.url for b in pool if b.source == source and b.state is not BackendState.DRAINING)


async def test_the_pool_follows_the_services_endpoint_slices(api):
    fake, kubeconfig = api
    pool, probed = BackendPool(), []

    async def on_added(backend):
        probed.append(backend.url)

    spec = DiscoverSpec(source="k8s:llama", flavor="llamacpp", weight=1.5, kubeconfig=kubeconfig)
    found = ServiceDiscovery(spec, pool, on_added)
    pool.add(BackendSpec(url="http://127.0.0.1:9", flavor="vllm"), source="file")  # not the discovery's to touch
    task = asyncio.create_task(found.run())
    try:
        await wait_until(lambda: urls(pool) == ["http://10.0.1.21:8080"])
        backend = pool.find("http://10.0.1.21:8080")
        assert (backend.spec.flavor, backend.spec.weight, backend.source) == ("llamacpp", 1.5, "k8s:llama")
        assert probed == ["http://10.0.1.21:8080"]  # probed at once, not a health round later
        assert fake.calls[0][:3] == ("GET", SLICES, {"labelSelector": "kubernetes.io/service-name=llama"})
        await wait_until(lambda: fake.watchers == 1)
        assert fake.calls[1][:3] == ("GET", SLICES, {"labelSelector": "kubernetes.io/service-name=llama",
                                                     "watch": "true", "resourceVersion": "5000"})

        # a second slice appears with a pod still starting: it joins as a backend (probes decide readiness)
        b = endpoint("llama-5c-b", "10.0.1.22", ready=False)
        await fake.events["llama"].put({"type": "ADDED", "object": llama_slice(b, name="llama-x2")})
        await wait_until(lambda: urls(pool) == ["http://10.0.1.21:8080", "http://10.0.1.22:8080"])
        assert pool.find("http://10.0.1.22:8080").state is BackendState.STARTING

        # the first pod terminates: it is drained out of the pool
        gone = endpoint("llama-5c-a", "10.0.1.21", ready=False, terminating=True)
        await fake.events["llama"].put({"type": "MODIFIED", "object": llama_slice(gone, name="llama-x1")})
        await wait_until(lambda: urls(pool) == ["http://10.0.1.22:8080"])
        assert pool.find("http://10.0.1.21:8080") is None  # nothing in flight: it left at once

        # the second slice is deleted: no pod of the Service is left, the file's backend stays
        await fake.events["llama"].put({"type": "DELETED", "object": llama_slice(b, name="llama-x2")})
        await wait_until(lambda: urls(pool) == [])
        assert urls(pool, "file") == ["http://127.0.0.1:9"]
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await found.close()


async def test_a_proxy_routes_to_the_pods_it_discovered(api):
    """Two pods on 127.0.0.1 listed by the Service's slices: the proxy finds them, its probes make
    them ready and requests reach them; a pod removed by a watch event stops getting requests."""
    fake, kubeconfig = api
    engines = [FakeBackend("pod-a"), FakeBackend("pod-b")]
    for engine in engines:
        await engine.start()
    fake.slices["llama"] = [endpoint_slice(endpoint(e.name, "127.0.0.1"), name=f"llama-{e.name}", service="llama",
                                           port=e.port) for e in engines]
    config = ProxyConfig(port=0, policy="round-robin")
    spec = DiscoverSpec(source="k8s:llama", flavor="openai", kubeconfig=kubeconfig)
    running = await start_proxy(config, extend=lambda app: attach(app, [spec]))
    try:
        pool = running.proxy.pool
        await wait_until(lambda: sum(b.state is BackendState.READY for b in pool) == 2)
        async with aiohttp.ClientSession() as session:
            for _ in range(4):
                async with session.post(running.url + "/v1/completions",
                                        json={"model": "tiny-llama", "prompt": "hi", "max_tokens": 2}) as resp:
                    assert resp.status == 200, await resp.text()
            assert [e.received for e in engines] == [2, 2]
            await fake.events["llama"].put({"type": "DELETED", "object": fake.slices["llama"][0]})
            await wait_until(lambda: [b.url for b in pool] == [engines[1].url])
            for _ in range(2):
                async with session.post(running.url + "/v1/completions",
                                        json={"model": "tiny-llama", "prompt": "hi", "max_tokens": 2}) as resp:
                    assert resp.status == 200
        assert [e.received for e in engines] == [2, 4]
    finally:
        await running.close()
        for engine in engines:
            await engine.stop()
    assert fake.watchers == 0  # the proxy closed its watch when it stopped


def test_discover_flags_and_fleet_file_entries(tmp_path):
    assert parse_discover_arg("llamacpp=k8s:llama") == DiscoverSpec(source="k8s:llama", flavor="llamacpp")
    assert parse_discover_arg("k8s:vllm").service == "vllm"
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("proxy:\n  policy: round-robin\n  discover:\n    - k8s:vllm\n"
                     "    - {source: 'k8s:llama', flavor: llamacpp, weight: 2, port_name: http}\n")
    assert file_specs(fleet) == [DiscoverSpec(source="k8s:vllm"),
                                 DiscoverSpec(source="k8s:llama", flavor="llamacpp", weight=2.0, port_name="http")]


@pytest.mark.parametrize(("entry", "message"), [
    ("'svc:llama'", "proxy.discover[0].source='svc:llama': must be k8s:SERVICE"),
    ("{source: 'k8s:llama', flavor: tgi}", "proxy.discover[0].flavor='tgi': must be one of vllm, llamacpp, openai"),
    ("{source: 'k8s:llama', weight: 0}", "proxy.discover[0].weight=0: must be > 0"),
    ("{source: 'k8s:llama', wieght: 2}", "proxy.discover[0].wieght=2: unknown key"),
    ("{flavor: vllm}", "proxy.discover[0]={'flavor': 'vllm'}: must be k8s:SERVICE or a mapping with a source"),
])
def test_a_bad_discover_entry_names_the_file_and_the_field(tmp_path, entry, message):
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(f"proxy:\n  discover:\n    - {entry}\n")
    with pytest.raises(ConfigError) as caught:
        file_specs(fleet)
    assert str(caught.value).startswith(f"{fleet}: {message}")
