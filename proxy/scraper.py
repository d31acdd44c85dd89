"""Scrape every backend's /metrics on a short interval and keep the newest sample with its time."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import aiohttp

from proxy.engine_metrics import LoadSample, parse_engine_metrics
from proxy.pool import Backend, BackendPool

log = logging.getLogger(__name__)

UNSUPPORTED_BACKOFF_ROUNDS = 40
"""A backend without /metrics (404/501) is asked again only every this many rounds."""


class Scraper:
    def __init__(self, pool: BackendPool, session: aiohttp.ClientSession, interval_s: float,
                 timeout_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.pool = pool
        self.session = session
        self.interval_s = interval_s
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.clock = clock
        self.round = 0
        self._skip_until: dict[str, int] = {}

    async def run(self) -> None:
        while True:
            await self.scrape_all()
            await asyncio.sleep(self.interval_s)

    async def scrape_all(self) -> None:
        self.round += 1
        due = [b for b in self.pool if self._skip_until.get(b.url, 0) <= self.round]
        await asyncio.gather(*(self.scrape_one(b) for b in due))

    async def scrape_one(self, backend: Backend) -> LoadSample | None:
        epoch = self.pool.begin_scrape(backend)
        sent_at_s = self.clock()
        sample = None
        try:
            async with self.session.get(backend.url + "/metrics", headers=backend.auth_headers,
                                        timeout=self.timeout) as resp:
                if resp.status in (404, 501):
                    self._skip_until[backend.url] = self.round + UNSUPPORTED_BACKOFF_ROUNDS
                elif resp.status == 200:
                    sample = parse_engine_metrics(await resp.text())
        except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
            log.debug("scrape of %s failed: %r", backend.url, exc)
        self.pool.record_scrape(backend, sample, epoch, sent_at_s)
        return sample
