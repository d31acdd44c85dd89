"""Disaggregated prefill/decode: the prefill phase in front of the ordinary dispatch.

With prefill backends (`flotilla proxy --prefill URL ... --decode URL ...`) each completion or
chat request first goes to a prefill replica, picked by its own policy (`--prefill-policy`),
as vLLM's toy_proxy_server.py sends it: not streamed, max_tokens 1, and `kv_transfer_params`
asking for remote decode. The replica's answer carries the `kv_transfer_params` a decode engine
needs; the original request goes on with them to the decode pool (the proxy's ordinary backends
and policy, with their retries, breakers and streaming), whose engine pulls the KV cache and
decodes. The client sees the decode replica's answer only: its usage counts the prompt once.

A prefill replica that fails (no connection, 5xx, 429) is retried on another; when none
answers, or one answers without `kv_transfer_params`, the request goes to the decode pool as it
came, and the decode replica computes the prompt itself (vLLM serves a request without
kv_transfer_params as a colocated engine would). Protocol, flags and metrics: docs/pd.md.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Coroutine, Mapping
from typing import Any

import aiohttp
import msgspec
from prometheus_client import Counter, Histogram

from policies.routing import create_policy
from proxy.config import ProxyConfig
from proxy.forward import upstream_headers, with_credentials
from proxy.health import HealthChecker
from proxy.metrics import RouterMetrics
from proxy.pool import Backend, BackendPool
from proxy.records import Forward
from proxy.retry import is_retryable_status
from proxy.router import Router
from proxy.scraper import Scraper

PREFILL_PARAMS: dict[str, Any] = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                                  "remote_block_ids": None, "remote_host": None, "remote_port": None}
"""The kv_transfer_params of a prefill request, as vLLM's toy_proxy_server.py sends them."""
PD_PATHS = ("/v1/completions", "/v1/chat/completions")
"""Routes served in two phases; every other route goes to the decode pool as it is."""
PREFILL_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def prefill_body(body: Mapping[str, Any]) -> dict[str, Any]:
    """The prefill request of a client request (pure): not streamed, one token, remote decode."""
    out = {k: v for k, v in body.items() if k != "stream_options"}
    out.update(kv_transfer_params=dict(PREFILL_PARAMS), stream=False, max_tokens=1)
    if "max_completion_tokens" in out:
        out["max_completion_tokens"] = 1
    return out


def decode_body(body: Mapping[str, Any], params: Mapping[str, Any]) -> bytes:
    """The client's request with the prefill replica's kv_transfer_params (pure)."""
    return json.dumps({**body, "kv_transfer_params": dict(params)}).encode()


class PdMetrics:
    """flotilla_pd_*: the prefill phase and how each request was served."""

    def __init__(self, metrics: RouterMetrics) -> None:
        r = metrics.registry
        self.requests = Counter("flotilla_pd_requests_total",
                                "P/D requests by how they were served: pd (prefill replica, then decode replica "
                                "with its kv_transfer_params) or fallback (the decode replica computed the prompt).",
                                ["outcome"], registry=r)
        self.prefill_s = Histogram("flotilla_pd_prefill_seconds",
                                   "Prefill phase: from the first prefill attempt to the answer carrying "
                                   "kv_transfer_params.", buckets=PREFILL_BUCKETS_S, registry=r)
        self.prefill_failures = Counter("flotilla_pd_prefill_failures_total",
                                        "Failed prefill attempts by backend and reason.", ["backend", "reason"],
                                        registry=r)
        for outcome in ("pd", "fallback"):
            self.requests.labels(outcome)


class PrefillStage:
    """The prefill pool, its policy, and the phase run before each generation request's dispatch."""

    def __init__(self, config: ProxyConfig, metrics: RouterMetrics, rng: random.Random) -> None:
        self.config = config
        self.pool = BackendPool(config.breaker)
        for spec in config.prefill_backends:  # a fleet file's own, as the decode pool's: its reloads drain them
            self.pool.add(spec, source="file" if config.config_path else "static")
        self.router = Router(self.pool, create_policy(config.prefill_policy, rng=rng), config.prefill_policy, metrics)
        self.metrics = PdMetrics(metrics)
        self.router_metrics = metrics
        self.session: aiohttp.ClientSession | None = None
        self.health: HealthChecker | None = None

    async def start(self, session: aiohttp.ClientSession) -> list[Coroutine[Any, Any, None]]:
        """Probe and scrape the prefill pool once (before serving); its loops, to run beside the
        decode pool's."""
        self.session = session
        health = self.health = HealthChecker(self.pool, session, self.router_metrics,
                                             self.config.health.interval_s, self.config.health.timeout_s)
        scraper = Scraper(self.pool, session, self.config.scrape_interval_s, self.config.scrape_timeout_s)
        await asyncio.gather(health.check_all(), scraper.scrape_all())
        return [health.run(), scraper.run()]

    async def probe_now(self, backend: Backend) -> None:
        """Probe a replica new to the prefill pool (a reload, the autoscaler) at once."""
        if self.health is not None:
            await self.health.check_one(backend)

    async def before_decode(self, fwd: Forward, client_headers: Mapping[str, str], request_id: str) -> Forward:
        """Run the prefill phase; the Forward to dispatch to the decode pool (with the prefill
        replica's kv_transfer_params, or unchanged when the phase failed: local prefill)."""
        path = fwd.path_qs.split("?", 1)[0]
        body = json.loads(fwd.body) if path in PD_PATHS else None
        if not isinstance(body, dict) or isinstance(body.get("kv_transfer_params"), dict):
            return fwd  # not a two-phase route, or the client speaks the protocol itself
        start = time.monotonic()
        params = await self._prefill(fwd, prefill_body(body), client_headers, request_id)
        if params is None:
            self.metrics.requests.labels("fallback").inc()
            return fwd
        self.metrics.prefill_s.observe(time.monotonic() - start)
        self.metrics.requests.labels("pd").inc()
        return msgspec.structs.replace(fwd, body=decode_body(body, params))

    async def _prefill(self, fwd: Forward, body: dict, client_headers: Mapping[str, str],
                       request_id: str) -> dict | None:
        """kv_transfer_params from the first prefill replica that gives them; None if none does."""
        headers = upstream_headers(client_headers, request_id, drop_authorization=bool(self.config.limits.api_keys))
        headers.popall("Content-Length", None)
        headers["Content-Type"] = "application/json"
        payload = json.dumps(body).encode()
        timeouts = self.config.timeouts
        timeout = aiohttp.ClientTimeout(total=timeouts.first_byte_s, sock_connect=timeouts.connect_s)
        tried: list = []
        for _ in range(self.config.retry.max_attempts):
            picked = self.router.pick(fwd.info, time.monotonic(), exclude=tried)
            if picked is None or self.session is None:
                return None
            backend = picked[0]
            tried.append(backend)
            reservation = self.pool.reserve(backend, fwd.info.prompt_tokens)
            try:
                async with self.session.post(backend.url + fwd.path_qs, data=payload, timeout=timeout,
                                             headers=with_credentials(headers, backend.spec.authorization)) as resp:
                    if resp.status == 200:
                        self.pool.record_success(backend)
                        answer = await resp.json(content_type=None)
                        params = answer.get("kv_transfer_params") if isinstance(answer, dict) else None
                        return params if isinstance(params, dict) else None
                    self.metrics.prefill_failures.labels(backend.url, f"status_{resp.status}").inc()
                    if not is_retryable_status(resp.status):
                        return None  # the request itself is refused: the decode replica answers the client
                    self.pool.record_failure(backend, time.monotonic())
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                self.metrics.prefill_failures.labels(backend.url, type(exc).__name__).inc()
                self.pool.record_failure(backend, time.monotonic())
            finally:
                self.pool.release(reservation)
        return None


def attach_prefill(config: ProxyConfig, metrics: RouterMetrics, rng: random.Random) -> PrefillStage | None:
    """The prefill stage when the config has prefill backends, else None (colocated serving)."""
    return PrefillStage(config, metrics, rng) if config.prefill_backends else None


__all__ = ["PD_PATHS", "PREFILL_PARAMS", "PdMetrics", "PrefillStage", "attach_prefill", "decode_body",
           "prefill_body"]
