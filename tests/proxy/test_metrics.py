import shutil
import subprocess

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.proxy.conftest import BackendFactory, ProxyFactory


async def _exposition(fake_backend: BackendFactory, proxy_for: ProxyFactory) -> str:
    b = await fake_backend(chunks=2)
    p = await proxy_for([b])
    async with aiohttp.ClientSession() as s:
        for stream in (False, True):
            async with s.post(p.url + "/v1/completions",
                              json={"model": "tiny-llama", "prompt": "x", "stream": stream}) as r:
                await r.read()
        async with s.get(p.url + "/metrics") as r:
            return await r.text()


async def test_router_metrics_cover_requests_latency_ttft_in_flight_and_state(
        fake_backend: BackendFactory, proxy_for: ProxyFactory) -> None:
    text = await _exposition(fake_backend, proxy_for)
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert all(name.startswith("flotilla_") for name in families)
    assert {"flotilla_requests", "flotilla_request_latency_seconds", "flotilla_time_to_first_token_seconds",
            "flotilla_backend_in_flight", "flotilla_retries", "flotilla_backend_ejections",
            "flotilla_routing_decisions", "flotilla_backend_state"} <= set(families)
    ttft_count = next(s.value for s in families["flotilla_time_to_first_token_seconds"].samples
                      if s.name.endswith("_count"))
    assert ttft_count == 2.0
    states = {s.labels["state"]: s.value for s in families["flotilla_backend_state"].samples}
    assert states == {"starting": 0.0, "ready": 1.0, "draining": 0.0, "ejected": 0.0}
    assert [s.value for s in families["flotilla_backend_in_flight"].samples] == [0.0]


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is installed by `make test`")
async def test_promtool_accepts_the_exposition(fake_backend: BackendFactory, proxy_for: ProxyFactory) -> None:
    text = await _exposition(fake_backend, proxy_for)
    out = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
