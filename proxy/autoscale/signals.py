"""Load signals for the scaling policies, from the proxy's own view or from Prometheus.

`PoolSignals` reads what the proxy already knows: the engine metrics its scraper keeps for every
ready backend, its own count of arriving requests, the requests it holds while no replica is
ready, and its own time-to-first-token histogram. `PrometheusSignals` asks a Prometheus server
the same questions through /api/v1/query, one configurable PromQL query per signal.
Both fill `ScalingSignals`; `SignalHistory` keeps a bounded window of them.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
from prometheus_client.registry import Collector

from flotilla.errors import FlagError
from policies.routing.base import BackendState
from policies.scaling.base import ScalingSignals
from proxy.pool import BackendPool

log = logging.getLogger(__name__)

# Backends that count towards the fleet's load: ready ones, and ejected ones (they were ready
# and their engines still hold requests).
SERVING_STATES = (BackendState.READY, BackendState.EJECTED)

# ScalingSignals field -> engine sample names, summed over replicas.
SUMMED = {
    "num_requests_waiting": "vllm:num_requests_waiting",
    "num_requests_running": "vllm:num_requests_running",
    "requests_deferred": "llamacpp:requests_deferred",
    "requests_processing": "llamacpp:requests_processing",
}
KV_USAGE_NAMES = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
QUANTILES = {"ttft_p50_s": 0.5, "ttft_p90_s": 0.9, "ttft_p99_s": 0.99}
TPOT = "vllm:request_time_per_output_token_seconds"
"""The engines' time per output token histogram; the scraper keeps its _sum and _count."""

DEFAULT_PROMETHEUS_QUERIES: dict[str, str] = {
    "arrival_rate_rps": "sum(rate(flotilla_autoscaler_arrivals_total[1m]))",
    "num_requests_waiting": "sum(vllm:num_requests_waiting)",
    "num_requests_running": "sum(vllm:num_requests_running)",
    "kv_cache_usage": "avg(vllm:kv_cache_usage_perc)",
    "requests_deferred": "sum(llamacpp:requests_deferred)",
    "requests_processing": "sum(llamacpp:requests_processing)",
    **{name: f"histogram_quantile({q}, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket[1m])))"
       for name, q in QUANTILES.items()},
}


class SignalError(FlagError):
    """A signal source setting that cannot be used."""


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """Prometheus' histogram_quantile over cumulative (upper bound, count) buckets, +Inf last:
    linear interpolation inside the bucket the rank falls in; None with no observations."""
    buckets = sorted(buckets)
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for upper_bound, count in buckets:
        if count >= rank:
            if math.isinf(upper_bound):  # the rank is past the last finite bucket
                return lower_bound
            share = (rank - lower_count) / (count - lower_count) if count > lower_count else 1.0
            return lower_bound + (upper_bound - lower_bound) * share
        lower_bound, lower_count = upper_bound, count
    return lower_bound


def cumulative_buckets(histogram: Collector) -> dict[float, float]:
    """upper bound -> cumulative count, summed over every label set of a histogram."""
    totals: dict[float, float] = {}
    for family in histogram.collect():
        for sample in family.samples:
            if sample.name.endswith("_bucket"):
                le = float(sample.labels["le"])
                totals[le] = totals.get(le, 0.0) + sample.value
    return totals


class ArrivalCounter:
    """Requests that reached the proxy, counted before routing or holding."""

    def __init__(self) -> None:
        self.count = 0

    def arrive(self) -> None:
        self.count += 1


class RateTracker:
    """Per-second rate of a growing count between successive readings."""

    def __init__(self) -> None:
        self._last: tuple[float, float] | None = None

    def rate(self, at_s: float, count: float) -> float | None:
        last, self._last = self._last, (at_s, count)
        if last is None or at_s <= last[0]:
            return None
        return max(0.0, count - last[1]) / (at_s - last[0])


@dataclass
class PoolSignals:
    """Signals from the proxy's own state (the default source)."""

    pool: BackendPool
    arrivals: ArrivalCounter
    ttft: Collector | None = None
    """The proxy's time-to-first-token histogram; percentiles cover the time since the last sample."""
    held: Callable[[], int] = lambda: 0
    """Requests the proxy holds while no replica is ready: they are waiting too."""

    def __post_init__(self) -> None:
        self._rate = RateTracker()
        self._last_buckets: dict[float, float] = {}
        self._last_tpot: dict[str, tuple[float, float]] = {}

    async def sample(self, at_s: float) -> ScalingSignals:
        samples = [b.sample for b in self.pool if b.state in SERVING_STATES and b.sample is not None]
        values: dict[str, float | None] = {f: _sum(s.metrics.get(name) for s in samples)
                                           for f, name in SUMMED.items()}
        held = self.held()
        if held:
            values["num_requests_waiting"] = (values["num_requests_waiting"] or 0.0) + held
        kv = [v for s in samples if (v := _first(s.metrics, KV_USAGE_NAMES)) is not None]
        values["kv_cache_usage"] = sum(kv) / len(kv) if kv else None
        values.update(self._ttft())
        values["tpot_p90_s"] = self._tpot()
        return ScalingSignals(at_s=at_s, arrival_rate_rps=self._rate.rate(at_s, self.arrivals.count), **values)

    def _ttft(self) -> dict[str, float | None]:
        if self.ttft is None:
            return {}
        now = cumulative_buckets(self.ttft)
        window = [(le, count - self._last_buckets.get(le, 0.0)) for le, count in now.items()]
        self._last_buckets = now
        return {name: histogram_quantile(q, window) for name, q in QUANTILES.items()}


    def _tpot(self) -> float | None:
        """The serving replicas' mean time per output token over the requests finished since the
        last sample (from their histograms' _sum and _count; the scraper keeps no buckets, so
        this mean stands in for the p90 a pd-decode policy reads)."""
        now = {b.url: (b.sample.metrics[TPOT + "_sum"], b.sample.metrics[TPOT + "_count"]) for b in self.pool
               if b.state in SERVING_STATES and b.sample is not None and TPOT + "_count" in b.sample.metrics}
        seconds = count = 0.0
        for url, (total, n) in now.items():
            last_total, last_n = self._last_tpot.get(url, (0.0, 0.0))
            if n >= last_n:  # a restarted engine starts its counts again: its window is lost
                seconds, count = seconds + total - last_total, count + n - last_n
        self._last_tpot = now
        return seconds / count if count > 0 else None


def _sum(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def _first(metrics: Mapping[str, float], names: Sequence[str]) -> float | None:
    return next((metrics[n] for n in names if n in metrics), None)


def parse_query_args(items: Iterable[str]) -> dict[str, str]:
    """`FIELD=PROMQL` settings over the default queries; `FIELD=` drops that signal."""
    queries = dict(DEFAULT_PROMETHEUS_QUERIES)
    for item in items:
        name, sep, query = item.partition("=")
        name = name.strip()
        if not sep or name not in DEFAULT_PROMETHEUS_QUERIES:
            raise SignalError(f"prometheus query {item!r}: expected FIELD=PROMQL with FIELD one of "
                              f"{', '.join(DEFAULT_PROMETHEUS_QUERIES)}")
        if query.strip():
            queries[name] = query.strip()
        else:
            queries.pop(name, None)
    return queries


@dataclass
class PrometheusSignals:
    """Signals from a Prometheus server's instant queries (GET /api/v1/query)."""

    url: str
    """Base URL of the server, e.g. http://prometheus:9090."""
    session: aiohttp.ClientSession
    queries: Mapping[str, str]
    """ScalingSignals field -> PromQL returning one number (a one-element vector or a scalar)."""
    timeout_s: float = 5.0
    held: Callable[[], int] = lambda: 0

    async def sample(self, at_s: float) -> ScalingSignals:
        names = list(self.queries)
        results = await asyncio.gather(*(self.query(self.queries[n]) for n in names))
        values = dict(zip(names, results, strict=True))
        held = self.held()
        if held:
            values["num_requests_waiting"] = (values.get("num_requests_waiting") or 0.0) + held
        return ScalingSignals(at_s=at_s, **values)

    async def query(self, promql: str) -> float | None:
        """The query's one value now; None when it has no result, is NaN or the server fails."""
        try:
            async with self.session.get(self.url.rstrip("/") + "/api/v1/query", params={"query": promql},
                                        timeout=aiohttp.ClientTimeout(total=self.timeout_s)) as resp:
                body = await resp.json(content_type=None)
        except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
            log.warning("prometheus query %r failed: %r", promql, exc)
            return None
        return query_value(body)


def query_value(body: object) -> float | None:
    """The number in an /api/v1/query answer: a scalar, or the sum of a vector's samples."""
    if not isinstance(body, dict) or body.get("status") != "success":
        log.warning("prometheus answered %r", body)
        return None
    data: dict[str, Any] = body.get("data") or {}
    result: Any = data.get("result")
    if data.get("resultType") == "scalar":
        values = [result[1]]
    elif data.get("resultType") == "vector" and isinstance(result, list):
        values = [item.get("value", [0, None])[1] for item in result if isinstance(item, dict)]
    else:
        return None
    try:
        numbers = [float(v) for v in values]
    except (TypeError, ValueError):
        return None
    total = sum(numbers)
    return None if not numbers or math.isnan(total) else total


class SignalHistory:
    """The newest samples, oldest first, bounded in age and in count."""

    def __init__(self, max_age_s: float = 900.0, max_samples: int = 4096) -> None:
        self.max_age_s = max_age_s
        self._samples: deque[ScalingSignals] = deque(maxlen=max_samples)

    def add(self, sample: ScalingSignals) -> None:
        self._samples.append(sample)
        while self._samples and sample.at_s - self._samples[0].at_s > self.max_age_s:
            self._samples.popleft()

    def __len__(self) -> int:
        return len(self._samples)

    def samples(self) -> list[ScalingSignals]:
        return list(self._samples)
