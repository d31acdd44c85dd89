"""The router's own Prometheus metrics, all under `flotilla_` (never an engine's prefix).

Each proxy owns a registry, so several proxies in one process (tests, benchmarks) never mix.
Gauges that describe the pool are refreshed when /metrics is read, not on every request.
The request path's counts (requests, latency, time to first token, routing decisions) are kept
in plain numbers and folded into prometheus_client's metrics by `flush`: before /metrics is
read, before the autoscaler reads the TTFT histogram, and every scrape round in a worker of
several. prometheus_client takes a lock and walks the buckets in Python on every call: a
fifteenth of the request path's instructions, where a tally costs a fifth of that.

A worker of `flotilla proxy --workers N` writes its values to files in $PROMETHEUS_MULTIPROC_DIR
(prometheus_client's multiprocess mode, set up by proxy/workers.py) and /metrics adds up every
worker's: counters and histograms sum; the pool gauges are set, by the worker answering, from
the state the workers share, so the most recent value is the fleet's.
"""

from __future__ import annotations

import glob
import os
from bisect import bisect_left
from collections.abc import Callable, Iterable
from typing import TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector

from policies.routing.base import BackendState
from proxy.pool import BackendPool

LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320, 640)
TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10,
                  20, 40, 80, 160)
_LATENCY_BOUNDS = (*LATENCY_BUCKETS_S, float("inf"))
_TTFT_BOUNDS = (*TTFT_BUCKETS_S, float("inf"))


class _ModelTally:
    """One model's latency and TTFT observations not yet in the histograms: a count per bucket
    (the first whose bound is at least the value, as prometheus_client files it) and the sum."""

    __slots__ = ("latency", "latency_sum", "ttft", "ttft_sum")

    def __init__(self) -> None:
        self.latency = [0] * len(_LATENCY_BOUNDS)
        self.latency_sum = 0.0
        self.ttft = [0] * len(_TTFT_BOUNDS)
        self.ttft_sum = 0.0


M = TypeVar("M", bound=MetricWrapperBase)


def _child(cache: dict[tuple[str, ...], M], metric: M, *labels: str) -> M:
    """`metric.labels(*labels)`, cached: `labels()` takes a lock and validates on every call."""
    child = cache.get(labels)
    if child is None:
        child = cache[labels] = metric.labels(*labels)
    return child


def _add_observations(child: Histogram, counts: list[int], total: float) -> None:
    """Fold bucket counts and their sum into a histogram child: what that many `observe` calls
    would have added. prometheus_client has no public call for it, so this writes the child's
    per-bucket values and its sum (`_buckets`, `_sum`, unchanged for years); tests/proxy/test_metrics.py
    compares the result with observing each value, so a change there fails a test, not a scrape."""
    if not any(counts):
        return
    for bucket, n in zip(child._buckets, counts, strict=True):
        if n:
            bucket.inc(n)
    child._sum.inc(total)


class RouterMetrics:
    def __init__(self) -> None:
        self.multiprocess_dir = os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None
        r = self.registry = CollectorRegistry()
        self.requests = Counter("flotilla_requests", "Requests answered, by model, backend and status",
                                ["model", "backend", "status"], registry=r)
        self.latency = Histogram("flotilla_request_latency_seconds", "Arrival to last byte",
                                 ["model"], buckets=LATENCY_BUCKETS_S, registry=r)
        self.ttft = Histogram("flotilla_time_to_first_token_seconds",
                              "Arrival to the first body byte sent to the client",
                              ["model"], buckets=TTFT_BUCKETS_S, registry=r)
        self.retries = Counter("flotilla_retries", "Retries to another backend, by reason", ["reason"],
                               registry=r)
        self.ejections = Counter("flotilla_backend_ejections", "Circuit-breaker openings", ["backend"],
                                 registry=r)
        self.decisions = Counter("flotilla_routing_decisions", "Routing decisions by policy and rule",
                                 ["policy", "rule"], registry=r)
        self.in_flight = Gauge("flotilla_backend_in_flight", "Router-side outstanding requests",
                               ["backend"], registry=r, multiprocess_mode="mostrecent")
        self.scrape_age = Gauge("flotilla_backend_scrape_age_seconds", "Age of the newest engine metrics",
                                ["backend"], registry=r, multiprocess_mode="mostrecent")
        self.state = Gauge("flotilla_backend_state", "1 for the state each backend is in",
                           ["backend", "state"], registry=r, multiprocess_mode="mostrecent")
        self._requests_by_key: dict[tuple[str, ...], Counter] = {}
        self._latency_by_model: dict[tuple[str, ...], Histogram] = {}
        self._ttft_by_model: dict[tuple[str, ...], Histogram] = {}
        self._decisions_by_key: dict[tuple[str, ...], Counter] = {}
        self._pending_requests: dict[tuple[str, str, int], int] = {}
        self._pending_by_model: dict[str, _ModelTally] = {}
        self._pending_decisions: dict[tuple[str, str], int] = {}
        self.prefix_predicted = Counter(
            "flotilla_prefix_cache_predicted_tokens",
            "Prompt tokens the routing policy expected the chosen backend to serve from its prefix "
            "cache, counted for requests whose engine reported its cache hits", ["backend"], registry=r)
        self.prefix_observed = Counter(
            "flotilla_prefix_cache_observed_tokens",
            "Prompt tokens the engine reported serving from its prefix cache, for the same requests",
            ["backend"], registry=r)
        self._predicted_by_backend: dict[tuple[str, ...], Counter] = {}
        self._observed_by_backend: dict[tuple[str, ...], Counter] = {}
        self.client_disconnects = Counter("flotilla_client_disconnects",
                                          "Requests whose client went away before the end", registry=r)

    def request_done(self, model: str, backend: str, status: int, latency_s: float,
                     ttft_s: float | None = None) -> None:
        """Count one answered request (in the tally: `flush` folds it in)."""
        key = (model, backend, status)
        pending = self._pending_requests
        pending[key] = pending.get(key, 0) + 1
        tally = self._pending_by_model.get(model)
        if tally is None:
            tally = self._pending_by_model[model] = _ModelTally()
        tally.latency[bisect_left(_LATENCY_BOUNDS, latency_s)] += 1
        tally.latency_sum += latency_s
        if ttft_s is not None:
            tally.ttft[bisect_left(_TTFT_BOUNDS, ttft_s)] += 1
            tally.ttft_sum += ttft_s

    def flush(self) -> None:
        """Fold the tally into the Prometheus metrics."""
        requests, self._pending_requests = self._pending_requests, {}
        for (model, backend, status), n in requests.items():
            _child(self._requests_by_key, self.requests, model, backend, str(status)).inc(n)
        by_model, self._pending_by_model = self._pending_by_model, {}
        for model, tally in by_model.items():
            _add_observations(_child(self._latency_by_model, self.latency, model), tally.latency, tally.latency_sum)
            _add_observations(_child(self._ttft_by_model, self.ttft, model), tally.ttft, tally.ttft_sum)
        decisions, self._pending_decisions = self._pending_decisions, {}
        for (policy, rule), n in decisions.items():
            _child(self._decisions_by_key, self.decisions, policy, rule).inc(n)

    def ttft_read(self) -> Flushed:
        """The TTFT histogram as the autoscaler reads it: with the tally folded in first."""
        return Flushed(self.ttft, self.flush)

    def prefix_prediction(self, backend: str, predicted_tokens: int, observed_tokens: int) -> None:
        """One request's predicted and reported prefix-cache hit, in tokens."""
        _child(self._predicted_by_backend, self.prefix_predicted, backend).inc(predicted_tokens)
        _child(self._observed_by_backend, self.prefix_observed, backend).inc(observed_tokens)

    def decision(self, policy: str, rule: str) -> None:
        key = (policy, rule)
        pending = self._pending_decisions
        pending[key] = pending.get(key, 0) + 1

    def refresh_pool(self, pool: BackendPool, now_s: float) -> None:
        if self.multiprocess_dir is None:  # prometheus_client cannot clear a multiprocess gauge
            for gauge in (self.in_flight, self.scrape_age, self.state):
                gauge.clear()  # backends that left must not linger
        for b in pool:
            self.in_flight.labels(b.url).set(b.total_in_flight()[0])
            if b.sample_time_s is not None:
                self.scrape_age.labels(b.url).set(now_s - b.sample_time_s)
            for state in BackendState:
                self.state.labels(b.url, state.value).set(1.0 if b.state is state else 0.0)

    def exposition(self) -> bytes:
        self.flush()
        if self.multiprocess_dir is None:
            return generate_latest(self.registry)
        return generate_latest(_AllWorkers(self.registry, self.multiprocess_dir))  # type: ignore[arg-type]


class Flushed:
    """A metric read only after `flush` (a collector: prometheus_client's `collect`)."""

    def __init__(self, metric: MetricWrapperBase, flush: Callable[[], None]) -> None:
        self.metric = metric
        self.flush = flush

    def collect(self) -> Iterable[Metric]:
        self.flush()
        return self.metric.collect()


def _nonempty(path: str) -> bool:
    try:
        return os.path.getsize(path) > 0
    except OSError:  # gone since the listing (a dead worker's live gauges)
        return False


class _AllWorkers:
    """Every worker's metric values from the multiprocess files, plus this worker's collectors
    that keep no values in them (the KV-event hub's, read from its live state)."""

    def __init__(self, registry: CollectorRegistry, directory: str) -> None:
        self.registry = registry
        self.directory = directory

    def collect(self):  # noqa: ANN201 - prometheus_client's collector protocol
        # A worker starting (one that replaces a dead worker) creates its file before it sizes it:
        # prometheus_client would fail on that empty file, so it is left out until it has a header.
        files = [f for f in glob.glob(os.path.join(self.directory, "*.db")) if _nonempty(f)]
        yield from MultiProcessCollector.merge(files, accumulate=True)
        # The registry's own collectors: prometheus_client offers no public list of them.
        for collector in list(self.registry._collector_to_names):
            if not isinstance(collector, MetricWrapperBase):
                yield from collector.collect()
