"""Signals for the scaling policies: from the proxy's scraped engine metrics, its arrivals and
its TTFT histogram, or from a (fake) Prometheus server's /api/v1/query."""

from __future__ import annotations

import math

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry, Histogram

from policies.routing.base import BackendState
from policies.scaling.base import ScalingSignals
from proxy.autoscale.signals import (
    DEFAULT_PROMETHEUS_QUERIES,
    ArrivalCounter,
    PoolSignals,
    PrometheusSignals,
    SignalError,
    SignalHistory,
    histogram_quantile,
    parse_query_args,
)
from proxy.config import BackendSpec
from proxy.engine_metrics import parse_engine_metrics
from proxy.pool import BackendPool

VLLM_PAGE = """# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="m"}} {running}
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0",model_name="m"}} {waiting}
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{engine="0",model_name="m"}} {kv}
"""
LLAMA_PAGE = """# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 3
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 2
"""


def test_histogram_quantile_interpolates_inside_the_bucket_as_prometheus_does():
    buckets = [(0.1, 10), (0.5, 30), (1.0, 40), (math.inf, 40)]
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.3)
    assert histogram_quantile(0.99, buckets) == pytest.approx(0.98)
    assert histogram_quantile(0.05, buckets) == pytest.approx(0.02)  # rank 2 of the first 10
    assert histogram_quantile(0.99, [(0.1, 1), (math.inf, 10)]) == 0.1  # past the last finite bound
    assert histogram_quantile(0.5, [(0.1, 0), (math.inf, 0)]) is None


def pool_with(*pages: tuple[str, BackendState]) -> BackendPool:
    pool = BackendPool()
    for i, (page, state) in enumerate(pages):
        backend = pool.add(BackendSpec(url=f"http://127.0.0.1:{9000 + i}", flavor="vllm"))
        backend.state = state
        backend.sample = parse_engine_metrics(page)
    return pool


async def test_pool_signals_sum_ready_replicas_and_count_held_requests_as_waiting():
    pool = pool_with((VLLM_PAGE.format(running=4, waiting=1, kv=0.5), BackendState.READY),
                     (VLLM_PAGE.format(running=2, waiting=3, kv=0.25), BackendState.READY),
                     (VLLM_PAGE.format(running=9, waiting=9, kv=0.9), BackendState.STARTING),
                     (LLAMA_PAGE, BackendState.READY))
    arrivals = ArrivalCounter()
    registry = CollectorRegistry()
    ttft = Histogram("ttft_seconds", "t", ["model"], buckets=(0.1, 0.5, 1.0), registry=registry)
    signals = PoolSignals(pool, arrivals, ttft, held=lambda: 5)
    first = await signals.sample(10.0)
    assert first.arrival_rate_rps is None  # no rate from one reading
    for _ in range(30):
        arrivals.arrive()
    for value, model in ((0.05, "a"), (0.3, "a"), (0.3, "b"), (0.7, "b")):
        ttft.labels(model).observe(value)
    s = await signals.sample(25.0)
    assert s.arrival_rate_rps == 2.0
    assert (s.num_requests_running, s.num_requests_waiting, s.kv_cache_usage) == (6.0, 4.0 + 5, 0.375)
    assert (s.requests_processing, s.requests_deferred) == (3.0, 2.0)
    assert s.ttft_p50_s == pytest.approx(0.3)  # rank 2 of 4: the end of the 0.1..0.5 bucket
    ttft.labels("a").observe(0.9)
    later = await signals.sample(26.0)
    assert later.ttft_p50_s == pytest.approx(0.75)  # only the new observation counts
    assert later.arrival_rate_rps == 0.0


class FakePrometheus:
    def __init__(self, answers: dict[str, dict]) -> None:
        self.answers = answers
        self.asked: list[str] = []

    async def query(self, request: web.Request) -> web.Response:
        promql = request.query["query"]
        self.asked.append(promql)
        if promql not in self.answers:
            return web.json_response({"status": "error", "errorType": "bad_data",
                                      "error": "1:1: parse error"}, status=400)
        return web.json_response(self.answers[promql])


def vector(*values: str) -> dict:
    return {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {"instance": f"10.0.0.{i}:8000"}, "value": [1733011200.0, v]} for i, v in enumerate(values)]}}


async def test_prometheus_signals_ask_one_query_per_signal(aiohttp_client):
    q = DEFAULT_PROMETHEUS_QUERIES
    fake = FakePrometheus({
        q["arrival_rate_rps"]: vector("4.5"),
        q["num_requests_waiting"]: vector("7"),
        q["num_requests_running"]: {"status": "success", "data": {"resultType": "scalar",
                                                                  "result": [1733011200.0, "12"]}},
        q["kv_cache_usage"]: vector("0.61"),
        q["requests_deferred"]: vector(),
        q["requests_processing"]: vector("1", "2"),
        q["ttft_p50_s"]: vector("NaN"),
        q["ttft_p90_s"]: vector("0.8"),
    })
    app = web.Application()
    app.router.add_get("/api/v1/query", fake.query)
    client = await aiohttp_client(app)
    source = PrometheusSignals(str(client.make_url("/")), client.session, q, held=lambda: 2)
    s = await source.sample(3.0)
    assert s == ScalingSignals(at_s=3.0, arrival_rate_rps=4.5, num_requests_waiting=9.0, num_requests_running=12.0,
                               kv_cache_usage=0.61, requests_deferred=None, requests_processing=3.0,
                               ttft_p50_s=None, ttft_p90_s=0.8, ttft_p99_s=None)
    assert sorted(fake.asked) == sorted(q.values())
    assert q["ttft_p99_s"] == ("histogram_quantile(0.99, sum by (le) "
                               "(rate(vllm:time_to_first_token_seconds_bucket[1m])))")


def test_query_overrides_replace_or_drop_a_signal():
    queries = parse_query_args(["num_requests_waiting=sum(vllm:num_requests_waiting{model_name='m'})",
                                "ttft_p99_s="])
    assert queries["num_requests_waiting"] == "sum(vllm:num_requests_waiting{model_name='m'})"
    assert "ttft_p99_s" not in queries and queries["kv_cache_usage"] == DEFAULT_PROMETHEUS_QUERIES["kv_cache_usage"]
    with pytest.raises(SignalError, match="FIELD=PROMQL"):
        parse_query_args(["gpu_util=avg(DCGM_FI_DEV_GPU_UTIL)"])


def test_history_keeps_a_bounded_window():
    history = SignalHistory(max_age_s=60, max_samples=100)
    for t in range(0, 200, 2):
        history.add(ScalingSignals(at_s=float(t)))
    kept = history.samples()
    assert kept[0].at_s == 138.0 and kept[-1].at_s == 198.0 and len(history) == 31
