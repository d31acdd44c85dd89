"""The load side: an open-loop client at a fixed rate and a closed-loop client at full speed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
import numpy as np

BODY = b'{"model": "bench", "prompt": "hello", "max_tokens": 2}'
STREAM_BODY = b'{"model": "bench", "prompt": "hello", "max_tokens": 16, "stream": true}'
HEADERS = {"Content-Type": "application/json"}


@dataclass
class Latencies:
    """Per-request times of one phase, in milliseconds."""

    values_ms: list[float]
    errors: int
    elapsed_s: float

    def pct(self, q: float) -> float:
        return float(np.percentile(self.values_ms, q)) if self.values_ms else float("nan")

    @property
    def rate(self) -> float:
        return len(self.values_ms) / self.elapsed_s if self.elapsed_s else 0.0


async def _one(session: aiohttp.ClientSession, url: str, stream: bool, t0: float, out: list[float]) -> bool:
    async with session.post(url, data=STREAM_BODY if stream else BODY, headers=HEADERS) as resp:
        if resp.status != 200:
            await resp.read()
            return False
        if stream:  # time to the first event, then drain (the whole stream must arrive)
            await resp.content.readuntil(b"\n\n")
            out.append((time.perf_counter() - t0) * 1000)
            # some proxies re-frame the stream: accept [DONE] with any trailing whitespace
            return (await resp.read()).rstrip().endswith(b"data: [DONE]")
        await resp.read()
        out.append((time.perf_counter() - t0) * 1000)
        return True


async def open_loop(url: str, rate: float, duration_s: float, stream: bool = False,
                    headers: dict[str, str] | None = None, timeout_s: float = 30.0,
                    tick: Callable[[], None] | None = None) -> Latencies:
    """Request i is sent at t0 + i / rate; its latency counts from that scheduled time, so a
    target that falls behind shows it (no coordinated omission)."""
    out: list[float] = []
    n = int(rate * duration_s)
    # perf_counter, not loop.time(): uvloop's clock ticks in whole milliseconds.
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), headers=headers,
                                     timeout=timeout) as session:
        start = time.perf_counter() + 0.05
        tasks = []
        for i in range(n):
            t = start + i / rate
            delay = t - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(_one(session, url, stream, t, out)))
            if tick:
                tick()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        errors = sum(1 for r in results if r is not True)
        elapsed = time.perf_counter() - start
    return Latencies(out, errors, elapsed)


async def closed_loop(url: str, concurrency: int, duration_s: float,
                      tick: Callable[[], None] | None = None) -> Latencies:
    """`concurrency` workers send back to back for `duration_s`: the target's maximum rate."""
    out: list[float] = []
    errors = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        start = time.perf_counter()
        end = start + duration_s

        async def worker() -> None:
            nonlocal errors
            while time.perf_counter() < end:
                try:
                    ok = await _one(session, url, False, time.perf_counter(), out)
                except aiohttp.ClientError:
                    ok = False
                errors += not ok
                if tick:
                    tick()

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - start
    return Latencies(out, errors, elapsed)
