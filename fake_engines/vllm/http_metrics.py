"""vLLM's http_* families: prometheus-fastapi-instrumentator 8.1 as vLLM 0.32 installs it.

vLLM adds `Instrumentator(excluded_handlers=[...]).add()` to its FastAPI app, so every scrape
ends with the instrumentator's default metrics: requests by method, status group and handler,
request and response sizes (the Content-Length headers only) and two latency histograms. The
handler is the route's path template; a request no route fully matches is grouped as "none";
a handler (or, unmatched, the raw path) that an excluded pattern finds anywhere in is not
counted at all, so /health, /metrics and also /v1/load_lora_adapter (it contains "/load") stay out.
"""

from __future__ import annotations

import re
import time

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram, Summary

EXCLUDED_HANDLERS = tuple(re.compile(p) for p in ("/metrics", "/health", "/load", "/ping", "/version",
                                                   "/server_info"))
"""vLLM's excluded_handlers (vllm/entrypoints/serve/instrumentator/metrics.py), matched with re.search."""
HIGHR_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0,
                   7.5, 10.0, 30.0, 60.0)
"""The instrumentator's default latency_highr_buckets."""
LOWR_BUCKETS_S = (0.1, 0.5, 1.0)
"""Its default latency_lowr_buckets."""
_SIZE_NOTE = "Only value of header is respected. Otherwise ignored. No percentile calculated. "


class HttpMetrics:
    """The five families, on the server's registry after the vllm:* ones."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter("http_requests_total", "Total number of requests by method, status and handler.",
                                ["method", "status", "handler"], registry=registry)
        self.request_size = Summary("http_request_size_bytes",
                                    f"Content length of incoming requests by handler. {_SIZE_NOTE}", ["handler"],
                                    registry=registry)
        self.response_size = Summary("http_response_size_bytes",
                                     f"Content length of outgoing responses by handler. {_SIZE_NOTE}", ["handler"],
                                     registry=registry)
        self.highr = Histogram("http_request_duration_highr_seconds",
                               "Latency with many buckets but no API specific labels. Made for more accurate "
                               "percentile calculations. ", buckets=HIGHR_BUCKETS_S, registry=registry)
        self.lowr = Histogram("http_request_duration_seconds",
                              "Latency with only few buckets by handler. Made to be only used if aggregation by "
                              "handler is important. ", ["handler", "method"], buckets=LOWR_BUCKETS_S,
                              registry=registry)

    def observe(self, handler: str, method: str, status: int, request_bytes: int, response_bytes: int,
                seconds: float) -> None:
        """One finished request."""
        self.requests.labels(method=method, status=f"{status // 100}xx", handler=handler).inc()
        self.request_size.labels(handler=handler).observe(request_bytes)
        self.response_size.labels(handler=handler).observe(response_bytes)
        self.highr.observe(seconds)
        self.lowr.labels(handler=handler, method=method).observe(seconds)


def handler_of(request: web.Request) -> str | None:
    """The handler label of `request`, or None when the instrumentator would not count it."""
    route = request.match_info.route
    templated = request.match_info.http_exception is None and route.resource is not None
    handler = route.resource.canonical if templated and route.resource is not None else request.path
    if any(pattern.search(handler) for pattern in EXCLUDED_HANDLERS):
        return None
    return handler if templated else "none"


def http_metrics_middleware(metrics: HttpMetrics):
    """An aiohttp middleware, outermost, that observes every answered request."""

    @web.middleware
    async def observe(request: web.Request, handler):
        name = handler_of(request)
        if name is None:
            return await handler(request)
        start, status = time.perf_counter(), 500
        response = None
        try:
            response = await handler(request)
            status = response.status
            return response
        except web.HTTPException as exc:
            status = exc.status
            raise
        finally:
            sent = response.content_length if response is not None and response.content_length else 0
            metrics.observe(name, request.method, status, request.content_length or 0, sent,
                            time.perf_counter() - start)

    return observe
