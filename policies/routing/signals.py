"""Shared helpers every policy uses: which backends may be routed to, and how loaded each one is.

Keeping both in one place means every policy filters health the same way and reads a load signal
the same way, so `signal=waiting` means one thing whichever policy is asked.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from policies.routing.base import BackendState, BackendView

SIGNALS: tuple[str, ...] = (
    "in_flight",
    "in_flight_tokens",
    "prefill_tokens",
    "waiting",
    "running",
    "kv_cache_usage",
)
"""Built-in load signals; any other name is looked up in `BackendView.metrics`."""

_METRIC_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*:[a-zA-Z0-9_:]+")


def routable_backends(backends: Sequence[BackendView], model: str | None = None) -> list[BackendView]:
    """The READY backends that serve `model` (a backend with no model list serves anything)."""
    ready = [b for b in backends if b.state is BackendState.READY]
    if model is None:
        return ready
    return [b for b in ready if not b.models or model in b.models]


def load_of(backend: BackendView, signal: str = "in_flight") -> float:
    """The value of `signal` on `backend`; lower means less loaded.

    `waiting` and `running` are the engine's counts as the proxy reports them (it adds the
    requests it sent since the last scrape to `num_requests_waiting`, so a burst is seen). An
    engine count never scraped reads as the router's in-flight count, so a fresh backend is
    neither shunned nor flooded.
    """
    if signal == "in_flight":
        return float(backend.in_flight)
    if signal == "in_flight_tokens":
        return float(backend.in_flight_tokens)
    if signal == "prefill_tokens":
        return float(backend.prefill_tokens)
    if signal == "waiting":
        return _engine_count(backend.num_requests_waiting, backend)
    if signal == "running":
        return _engine_count(backend.num_requests_running, backend)
    if signal == "kv_cache_usage":
        return backend.kv_cache_usage if backend.kv_cache_usage is not None else 0.0
    return float(backend.metrics.get(signal, 0.0))


def _engine_count(scraped: float | None, backend: BackendView) -> float:
    return float(backend.in_flight) if scraped is None else float(scraped)


def least_loaded(backends: Sequence[BackendView], signal: str = "in_flight") -> BackendView:
    """The backend with the least `signal`; ties go to the lowest index."""
    return min(backends, key=lambda b: (load_of(b, signal), b.index))


def is_known_signal(signal: str) -> bool:
    """True for a built-in signal or an engine metric name such as `vllm:num_requests_waiting`.

    Metric names must carry their engine prefix, so a misspelt built-in is caught at parse time.
    """
    return signal in SIGNALS or _METRIC_NAME.fullmatch(signal) is not None


def mean_load(backends: Sequence[BackendView], signal: str) -> float:
    """Arithmetic mean of `signal` over `backends` (0 for an empty list)."""
    if not backends:
        return 0.0
    return sum(load_of(b, signal) for b in backends) / len(backends)
