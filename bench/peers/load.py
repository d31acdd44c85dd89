"""Load for the overhead benchmark: an open-loop aiohttp client at a fixed rate (non-streaming
latency, or streaming time to first byte), and wrk for the most requests per second."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import numpy as np

MODEL = "bench"
BODY = json.dumps({"model": MODEL, "prompt": "hello", "max_tokens": 2}).encode()
STREAM_BODY = json.dumps({"model": MODEL, "prompt": "hello", "max_tokens": 16, "stream": True}).encode()


@dataclass
class Phase:
    """One load phase against one target."""

    values_ms: list[float]
    """Latency (non-streaming) or time to the first SSE event (streaming) of each good request, ms."""
    errors: int
    """Requests that failed, timed out, or (streaming) did not end with [DONE]."""
    elapsed_s: float
    """From the first scheduled send to the last answer."""

    def pct(self, q: float) -> float:
        return float(np.percentile(self.values_ms, q)) if self.values_ms else float("nan")

    @property
    def rate(self) -> float:
        return len(self.values_ms) / self.elapsed_s if self.elapsed_s else 0.0


async def _one(session: aiohttp.ClientSession, url: str, stream: bool, t0: float, out: list[float]) -> bool:
    async with session.post(url, data=STREAM_BODY if stream else BODY) as resp:
        if resp.status != 200:
            await resp.read()
            return False
        if stream:
            await resp.content.readuntil(b"\n\n")
            out.append((time.perf_counter() - t0) * 1000)
            return (await resp.read()).rstrip().endswith(b"data: [DONE]")
        await resp.read()
        out.append((time.perf_counter() - t0) * 1000)
        return True


async def open_loop(url: str, rate: float, duration_s: float, stream: bool = False,
                    headers: dict[str, str] | None = None, timeout_s: float = 30.0,
                    tick: Callable[[], None] | None = None) -> Phase:
    """Request i leaves at t0 + i/rate and its latency counts from then (no coordinated omission)."""
    out: list[float] = []
    hdrs = {"Content-Type": "application/json", **(headers or {})}
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), headers=hdrs,
                                     timeout=timeout) as session:
        start = time.perf_counter() + 0.05
        tasks = []
        for i in range(int(rate * duration_s)):
            t = start + i / rate
            if (delay := t - time.perf_counter()) > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(_one(session, url, stream, t, out)))
            if tick:
                tick()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        elapsed = time.perf_counter() - start
    return Phase(out, sum(1 for r in results if r is not True), elapsed)


WRK_LUA = """wrk.method = "POST"
wrk.body = '{body}'
wrk.headers["Content-Type"] = "application/json"
{auth}
"""


@dataclass
class WrkResult:
    """What wrk printed: requests per second, latency percentiles and failures."""

    rps: float
    p50_ms: float
    p99_ms: float
    requests: int
    errors: int
    """Socket errors plus non-2xx/3xx responses."""


_UNITS_MS = {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60000.0}


def _ms(text: str | None) -> float:
    """wrk's '612.00us' or '1.20s' in ms; NaN when wrk printed none (no request finished)."""
    match = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text or "")
    if match is None:
        return float("nan")
    value, unit = match.groups()
    return float(value) * _UNITS_MS[unit]


def parse_wrk(text: str) -> WrkResult:
    """Parse `wrk --latency` output."""
    pct = dict(re.findall(r"^\s*(50|99)(?:\.0+)?%\s+(\S+)\s*$", text, re.M))
    total = int(re.search(r"^\s*(\d+) requests in", text, re.M).group(1))
    errors = sum(int(x) for x in re.findall(r"(?:connect|read|write|timeout) (\d+)", text))
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    return WrkResult(rps=float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1)),
                     p50_ms=_ms(pct.get("50")), p99_ms=_ms(pct.get("99")), requests=total,
                     errors=errors + (int(non2xx.group(1)) if non2xx else 0))


def run_wrk(url: str, duration_s: float, connections: int, workdir: Path,
            headers: dict[str, str] | None = None) -> WrkResult:
    """wrk -t1 against `url` with the non-streaming body (one thread: the load generator's share of
    the machine stays small and the same for every target)."""
    auth = "\n".join(f'wrk.headers["{k}"] = "{v}"' for k, v in (headers or {}).items())
    script = workdir / "post.lua"
    script.write_text(WRK_LUA.format(body=BODY.decode(), auth=auth))
    res = subprocess.run(["wrk", "-t1", f"-c{connections}", f"-d{duration_s:g}s", "--latency", "-s", str(script),
                          url], capture_output=True, text=True, timeout=duration_s + 60, check=True)
    (workdir / "wrk-last.txt").write_text(res.stdout + res.stderr)  # kept for a look when figures look odd
    return parse_wrk(res.stdout)
