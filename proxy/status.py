"""The live status table of `flotilla up`, from the proxy's and the engines' /metrics (pure).

The proxy's `flotilla_backend_state`, `flotilla_backend_in_flight` and `flotilla_requests_total`
give each replica's state, router-side load and answered requests; each engine's own metrics add
its queue and KV-cache usage. Requests per second come from two snapshots' counters.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from prometheus_client.parser import text_string_to_metric_families

from proxy.engine_metrics import parse_engine_metrics


@dataclass(frozen=True)
class BackendStatus:
    """One replica as the proxy and the engine report it."""

    url: str
    """Backend base URL, as the proxy labels it."""
    state: str = "unknown"
    """starting, ready, draining or ejected (the proxy's view)."""
    in_flight: float = 0.0
    """Requests the proxy has outstanding on it."""
    requests_total: float = 0.0
    """Requests it answered since the proxy started (any status)."""
    flavor: str = ""
    """vllm or llamacpp, told by the engine's metric names; empty while it cannot be scraped."""
    waiting: float | None = None
    """Requests queued inside the engine (vLLM waiting, llama.cpp deferred)."""
    kv_usage: float | None = None
    """KV-cache usage in [0, 1]."""


@dataclass(frozen=True)
class FleetStatus:
    """One snapshot of the whole fleet."""

    at_s: float
    """When it was taken, seconds on the caller's monotonic clock."""
    backends: tuple[BackendStatus, ...]
    """Every backend the proxy knows, sorted by URL."""
    desired_replicas: float | None = None
    """The autoscaler's desired replica count, when one runs in the proxy."""

    @property
    def ready(self) -> int:
        return sum(1 for b in self.backends if b.state == "ready")


def _samples(text: str):
    for family in text_string_to_metric_families(text):
        yield from family.samples


def parse_proxy_metrics(text: str) -> tuple[dict[str, BackendStatus], float | None]:
    """Backends and the autoscaler's desired count from the proxy's /metrics text."""
    rows: dict[str, BackendStatus] = {}
    desired: float | None = None

    def row(url: str) -> BackendStatus:
        return rows.setdefault(url, BackendStatus(url=url))

    for s in _samples(text):
        backend = s.labels.get("backend")
        if s.name == "flotilla_backend_state" and s.value == 1 and backend:
            rows[backend] = replace(row(backend), state=s.labels.get("state", "unknown"))
        elif s.name == "flotilla_backend_in_flight" and backend:
            rows[backend] = replace(row(backend), in_flight=s.value)
        elif s.name == "flotilla_requests_total" and backend:
            rows[backend] = replace(row(backend), requests_total=row(backend).requests_total + s.value)
        elif s.name == "flotilla_autoscaler_desired_replicas":
            desired = s.value
    return rows, desired


def with_engine(backend: BackendStatus, engine_text: str | None) -> BackendStatus:
    """Add what the engine's own /metrics says; None (unreachable) leaves the row as it is."""
    if not engine_text:
        return backend
    sample = parse_engine_metrics(engine_text)
    flavor = "vllm" if "vllm:" in engine_text else "llamacpp" if "llamacpp:" in engine_text else "openai"
    return replace(backend, flavor=flavor, waiting=sample.num_requests_waiting, kv_usage=sample.kv_cache_usage)


def fleet_status(at_s: float, proxy_text: str, engine_texts: Mapping[str, str | None]) -> FleetStatus:
    """Combine one scrape of the proxy with one scrape of each engine (keyed by backend URL)."""
    rows, desired = parse_proxy_metrics(proxy_text)
    backends = tuple(with_engine(rows[url], engine_texts.get(url)) for url in sorted(rows))
    return FleetStatus(at_s=at_s, backends=backends, desired_replicas=desired)


def requests_per_s(now: FleetStatus, before: FleetStatus | None) -> dict[str, float]:
    """Per backend URL, answered requests per second between two snapshots (0 without a previous one)."""
    if before is None or now.at_s <= before.at_s:
        return {b.url: 0.0 for b in now.backends}
    dt = now.at_s - before.at_s
    old = {b.url: b.requests_total for b in before.backends}
    return {b.url: max(0.0, b.requests_total - old.get(b.url, b.requests_total)) / dt for b in now.backends}


def _opt(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


HEADER = f"{'backend':<26} {'flavor':<9} {'state':<9} {'in-flight':>9} {'waiting':>8} {'KV use':>7} {'req/s':>7}"


def format_table(now: FleetStatus, before: FleetStatus | None = None) -> str:
    """The status table: one line per replica and a fleet total."""
    rates = requests_per_s(now, before)
    lines = [HEADER]
    for b in now.backends:
        kv = "-" if b.kv_usage is None else f"{100 * b.kv_usage:.1f}%"
        lines.append(f"{b.url:<26} {b.flavor or '-':<9} {b.state:<9} {b.in_flight:>9.0f} "
                     f"{_opt(b.waiting, '.0f'):>8} {kv:>7} {rates[b.url]:>7.1f}")
    lines.append(_total(now, rates))
    return "\n".join(lines)


def _total(now: FleetStatus, rates: Mapping[str, float], extra: str = "") -> str:
    total = (f"{now.ready}/{len(now.backends)} ready, {sum(b.in_flight for b in now.backends):.0f} in flight, "
             f"{extra}{sum(rates.values()):.1f} req/s")
    if now.desired_replicas is not None:
        total += f", autoscaler wants {now.desired_replicas:.0f}"
    return total


def format_line(now: FleetStatus, before: FleetStatus | None = None) -> str:
    """The fleet total on one line, with the queue and the fullest KV cache: what a log that is
    not a terminal gets each refresh instead of the whole table."""
    waiting = [b.waiting for b in now.backends if b.waiting is not None]
    kv = [b.kv_usage for b in now.backends if b.kv_usage is not None]
    extra = (f"{sum(waiting):.0f} waiting, " if waiting else "") + (f"KV max {100 * max(kv):.1f}%, " if kv else "")
    return _total(now, requests_per_s(now, before), extra)
