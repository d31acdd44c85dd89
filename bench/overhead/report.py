"""The overhead table, and its section of docs/benchmarks.md (the rest of the file is left alone)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

START = "<!-- overhead:start -->"
END = "<!-- overhead:end -->"


@dataclass
class TargetResult:
    """One target (direct or through the proxy) over all phases."""

    name: str
    p50_ms: float
    p99_ms: float
    ttfb_p50_ms: float
    ttfb_p99_ms: float
    max_rps: float
    errors: int
    cpu_ms_per_req_at_rate: float | None = None
    """Proxy CPU (user + system) per request in the fixed-rate phase; None for direct."""
    cpu_ms_per_req_at_max: float | None = None


def _f(x: float | None, digits: int = 2) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def table(results: list[TargetResult], rate: float) -> str:
    direct = results[0]
    head = (f"| target | p50 / p99 ms @ {rate:g} req/s | added p50 / p99 ms | stream TTFB p50 / p99 ms "
            f"@ {rate / 2:g} req/s | added TTFB p50 ms | max req/s | proxy CPU ms per request (@ rate ; @ max) "
            "| errors |\n|---|---|---|---|---|---|---|---|")
    rows = []
    for r in results:
        added = "–" if r is direct else f"{r.p50_ms - direct.p50_ms:+.2f} / {r.p99_ms - direct.p99_ms:+.2f}"
        added_ttfb = "–" if r is direct else f"{r.ttfb_p50_ms - direct.ttfb_p50_ms:+.2f}"
        cpu = "–" if r.cpu_ms_per_req_at_rate is None else (
            f"{_f(r.cpu_ms_per_req_at_rate, 3)} ; {_f(r.cpu_ms_per_req_at_max, 3)}")
        rows.append(f"| {r.name} | {_f(r.p50_ms)} / {_f(r.p99_ms)} | {added} | {_f(r.ttfb_p50_ms)} / "
                    f"{_f(r.ttfb_p99_ms)} | {added_ttfb} | {r.max_rps:,.0f} | {cpu} | {r.errors} |")
    return "\n".join([head, *rows])


def section(results: list[TargetResult], rate: float, duration_s: float, concurrency: int, rounds: int,
            machine: str, command: str) -> str:
    return f"""{START}
## Proxy overhead

`{command}` measures, in one run, the same zero-latency backend (`bench/overhead/backend.py`: a
pre-encoded JSON answer, or 16 SSE chunks and `[DONE]`) directly and through `flotilla proxy`
(uvloop, policy `least-outstanding`; one process, or `--workers N` processes where the row
says so), and through the plain aiohttp proxy of
`bench/overhead/floor.py` when it is listed: what any aiohttp + uvloop proxy pays. Flotilla's
completions and chat no longer go through aiohttp (`proxy/fastpath.py`), so it can come in under it. Fixed-rate phases are open loop: request *i* is
sent at t0 + i/rate and its latency counts from that time, so falling behind shows. The
maximum rate is {concurrency} closed-loop connections for {duration_s:g} s. Proxy CPU is user plus system
time of the proxy's whole process tree from `/proc` over each phase, divided by the requests
served. Each phase runs on every target back to back, {rounds} rounds in all; every figure is the median over rounds.

Machine: {machine}. The load generator, the backend and the proxy share its cores, so max req/s
measures CPU cost as much as anything; CPU per request is the steadier figure.

{table(results, rate)}
{END}"""


def write_section(path: Path, text: str) -> None:
    """Replace the overhead section of `path` (or append it; create the file if missing)."""
    replace_section(path, START, END, text)


def replace_section(path: Path, start: str, end: str, text: str) -> None:
    """Replace the text from `start` to `end` in `path` with `text` (or append it)."""
    old = path.read_text() if path.exists() else "# Benchmarks\n"
    pattern = re.compile(re.escape(start) + ".*?" + re.escape(end), re.S)
    new = pattern.sub(lambda _m: text, old) if pattern.search(old) else old.rstrip("\n") + "\n\n" + text + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(new)
