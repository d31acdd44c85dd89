"""Active health probes and model discovery.

A probe's answer moves a backend between starting, ready and ejected (see `breaker.classify_probe`
for telling a loading engine from a broken one). Ejected backends are probed only once their
circuit is half-open, and those probes count toward closing it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import aiohttp

from policies.routing.base import BackendState
from proxy.breaker import CircuitState, ProbeOutcome, ProbeResult, classify_probe
from proxy.metrics import RouterMetrics
from proxy.pool import Backend, BackendPool

log = logging.getLogger(__name__)

STALLED_AFTER = 1.5
"""A probe that timed out after this many times its timeout was cut short by the proxy's own
stall, not by the backend: its timer could not fire on time, so neither could the answer be read."""

DISCOVERY_EVERY_ROUNDS = 30
"""Refresh each ready backend's /v1/models every this many probe rounds (adapters come and go)."""


async def probe(session: aiohttp.ClientSession, url: str, timeout_s: float,
                headers: dict[str, str] | None = None) -> ProbeResult:
    """GET /health; a plain OpenAI-compatible server without one is probed on /v1/models instead."""
    result = await _get(session, url + "/health", timeout_s, headers)
    if result.status == 404:
        result = await _get(session, url + "/v1/models", timeout_s, headers)
    return result


async def _get(session: aiohttp.ClientSession, url: str, timeout_s: float,
               headers: dict[str, str] | None) -> ProbeResult:
    loop = asyncio.get_running_loop()
    sent = loop.time()
    try:
        async with session.get(url, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            return ProbeResult(status=resp.status, body=await resp.read())
    except aiohttp.ClientConnectorError:
        return ProbeResult(status=None, connection_refused=True)
    except TimeoutError:
        return ProbeResult(status=None, stalled=loop.time() - sent > STALLED_AFTER * timeout_s)
    except aiohttp.ClientError:
        return ProbeResult(status=None)


async def discover_models(session: aiohttp.ClientSession, backend: Backend, timeout_s: float) -> None:
    """Learn the backend's models and LoRA adapters (cards with a `parent`) from /v1/models."""
    try:
        async with session.get(backend.url + "/v1/models", headers=backend.auth_headers,
                               timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            if resp.status != 200:
                return
            cards = (await resp.json(content_type=None)).get("data", [])
    except (TimeoutError, aiohttp.ClientError, ValueError, AttributeError):
        return
    cards = [c for c in cards if isinstance(c, dict) and isinstance(c.get("id"), str)]
    backend.model_cards = tuple(cards)
    if backend.spec.flavor != "llamacpp":
        # llama-server serves its one model under any name and lists it by file path, so what
        # it lists does not restrict routing (declare `models` in the fleet file to do that).
        backend.discovered_models = frozenset(c["id"] for c in cards if not c.get("parent"))
    backend.adapters = frozenset(c["id"] for c in cards if c.get("parent"))


class HealthChecker:
    def __init__(self, pool: BackendPool, session: aiohttp.ClientSession, metrics: RouterMetrics,
                 interval_s: float, timeout_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.pool = pool
        self.session = session
        self.metrics = metrics
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.clock = clock
        self.round = 0

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self.check_all()

    async def check_all(self) -> None:
        self.round += 1
        await asyncio.gather(*(self.check_one(b) for b in list(self.pool)))

    async def check_one(self, backend: Backend) -> None:
        if backend.state is BackendState.DRAINING:
            return
        if backend.state is BackendState.EJECTED:
            if not backend.breaker.allows_request(self.clock()):
                return
            backend.breaker.start_probe()
        result = await probe(self.session, backend.url, self.timeout_s, backend.auth_headers)
        outcome = classify_probe(result, backend.ever_ready)
        await self.apply(backend, outcome)

    async def apply(self, backend: Backend, outcome: ProbeOutcome) -> None:
        if backend.state is BackendState.DRAINING:
            return
        if outcome is ProbeOutcome.HEALTHY:
            await self._healthy(backend)
        elif outcome is ProbeOutcome.INCONCLUSIVE:
            backend.breaker.probe_in_flight = False
            log.info("probe of %s timed out while the proxy was stalled: not counted", backend.url)
        elif outcome is ProbeOutcome.LOADING:
            backend.breaker.probe_in_flight = False
            if backend.state is BackendState.READY:
                backend.state = BackendState.STARTING
        elif backend.state is not BackendState.STARTING or backend.ever_ready:
            if self.pool.record_failure(backend, self.clock()):
                self.metrics.ejections.labels(backend.url).inc()
                log.warning("ejected %s after failed health probes", backend.url)

    async def _healthy(self, backend: Backend) -> None:
        first = not backend.ever_ready or backend.state is BackendState.STARTING
        if backend.state is BackendState.EJECTED:
            self.pool.record_success(backend)
        elif backend.breaker.state is CircuitState.CLOSED:
            backend.state = BackendState.READY
        backend.ever_ready = True
        if first or self.round % DISCOVERY_EVERY_ROUNDS == 0:
            await discover_models(self.session, backend, self.timeout_s)
