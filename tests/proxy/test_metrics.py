import json
import shutil
import subprocess
from pathlib import Path

import aiohttp
import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.mmap_dict import MmapedDict
from prometheus_client.parser import text_string_to_metric_families

from proxy.metrics import LATENCY_BUCKETS_S, TTFT_BUCKETS_S, RouterMetrics, _AllWorkers
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


def _samples(registry: CollectorRegistry) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for m in registry.collect() for s in m.samples
            if not s.name.endswith("_created")}


def test_the_tally_folds_in_as_observing_each_request_would() -> None:
    # Values on, between and beyond the buckets' bounds: each lands where observe() files it.
    latencies = [0.0, 0.005, 0.0051, 0.3, 2.5, 700.0, 0.01]
    ttfts = [0.001, 0.0011, 0.5, None, 200.0, 0.0, 0.02]
    tallied = RouterMetrics()
    direct = CollectorRegistry()
    requests = Counter("flotilla_requests", "", ["model", "backend", "status"], registry=direct)
    latency = Histogram("flotilla_request_latency_seconds", "", ["model"], buckets=LATENCY_BUCKETS_S,
                        registry=direct)
    ttft = Histogram("flotilla_time_to_first_token_seconds", "", ["model"], buckets=TTFT_BUCKETS_S,
                     registry=direct)
    decisions = Counter("flotilla_routing_decisions", "", ["policy", "rule"], registry=direct)
    for i, (latency_s, ttft_s) in enumerate(zip(latencies, ttfts, strict=True)):
        model, status = ("m", 200) if i % 3 else ("n", 503)
        tallied.request_done(model, "http://b", status, latency_s, ttft_s)
        tallied.decision("p", "r")
        requests.labels(model, "http://b", str(status)).inc()
        latency.labels(model).observe(latency_s)
        if ttft_s is not None:
            ttft.labels(model).observe(ttft_s)
        decisions.labels("p", "r").inc()
        if i == 3:  # a read in between: folded once, not twice
            tallied.exposition()
    tallied.exposition()
    got = _samples(tallied.registry)
    want = _samples(direct)
    assert want and all(got[key] == pytest.approx(value) for key, value in want.items())
    # the autoscaler's read folds in what came since, for every model
    tallied.request_done("m", "http://b", 200, 0.1, 0.03)
    counts = [s.value for family in tallied.ttft_read().collect() for s in family.samples if s.name.endswith("_count")]
    assert sum(counts) == sum(t is not None for t in ttfts) + 1


def test_nothing_is_counted_before_the_tally_is_read() -> None:
    metrics = RouterMetrics()
    metrics.request_done("m", "http://b", 200, 0.1, 0.01)
    key = ("flotilla_requests_total", (("backend", "http://b"), ("model", "m"), ("status", "200")))
    assert key not in _samples(metrics.registry)  # not folded in yet: the request path took no lock
    list(metrics.ttft_read().collect())
    assert _samples(metrics.registry)[key] == 1


def test_a_starting_workers_empty_metrics_file_does_not_fail_the_exposition(tmp_path: Path) -> None:
    # A worker that replaces a dead one creates its file before it sizes it; /metrics read by
    # another worker in that moment answered 500 (struct.error on the empty file).
    values = MmapedDict(str(tmp_path / "counter_100.db"))
    values.write_value(json.dumps(["flotilla_x", "flotilla_x_total", {"backend": "a"}, "x"]), 3.0, 0.0)
    values.close()
    (tmp_path / "counter_101.db").touch()  # the new worker's, not yet sized
    workers = _AllWorkers(CollectorRegistry(), str(tmp_path))
    samples = {s.name: s.value for f in workers.collect() for s in f.samples}
    assert samples == {"flotilla_x_total": 3.0}
