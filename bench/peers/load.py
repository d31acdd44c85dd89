"""Load for the peer overhead benchmark: wrk for the most requests per second. The open-loop
client (fixed rate, latency or streaming time to first byte) is bench/overhead's, shared."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from bench.overhead.load import BODY, Latencies, open_loop

__all__ = ["BODY", "Latencies", "WrkResult", "open_loop", "parse_wrk", "run_wrk"]


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
