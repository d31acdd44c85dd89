"""wrk's output parsed into requests per second, latency percentiles and failures."""

from __future__ import annotations

import pytest

from bench.peers.load import Latencies, parse_wrk

WRK_OUT = """Running 5s test @ http://127.0.0.1:40123/v1/completions
  1 threads and 64 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     8.12ms    3.40ms  46.85ms   81.20%
    Req/Sec     6.31k   412.55     7.02k    72.00%
  Latency Distribution
     50%    7.45ms
     75%    9.10ms
     90%   11.87ms
     99%  612.00us
  31395 requests in 5.00s, 13.77MB read
  Socket errors: connect 0, read 3, write 1, timeout 2
  Non-2xx or 3xx responses: 5
Requests/sec:   6274.31
Transfer/sec:      2.75MB
"""


def test_wrk_figures_and_units_are_read() -> None:
    r = parse_wrk(WRK_OUT)
    assert r.rps == 6274.31
    assert r.p50_ms == pytest.approx(7.45)
    assert r.p99_ms == pytest.approx(0.612)  # microseconds become milliseconds
    assert r.requests == 31395


def test_wrk_socket_errors_and_non_2xx_count_as_errors() -> None:
    assert parse_wrk(WRK_OUT).errors == 3 + 1 + 2 + 5


def test_wrk_clean_run_has_no_errors_and_seconds_convert() -> None:
    clean = WRK_OUT.replace("  Socket errors: connect 0, read 3, write 1, timeout 2\n", "").replace(
        "  Non-2xx or 3xx responses: 5\n", "").replace("612.00us", "1.20s")
    r = parse_wrk(clean)
    assert r.errors == 0
    assert r.p99_ms == pytest.approx(1200.0)


def test_phase_percentiles_and_rate() -> None:
    p = Latencies(values_ms=[float(v) for v in range(1, 101)], errors=0, elapsed_s=2.0)
    assert p.pct(50) == pytest.approx(50.5)
    assert p.pct(99) == pytest.approx(99.01)
    assert p.rate == 50.0


def test_empty_phase_has_nan_percentiles_and_zero_rate() -> None:
    p = Latencies(values_ms=[], errors=4, elapsed_s=0.0)
    assert p.pct(50) != p.pct(50)
    assert p.rate == 0.0


def test_wrk_without_a_latency_distribution_gives_nan_not_a_crash() -> None:
    lines = [ln for ln in WRK_OUT.splitlines() if "%" not in ln or "Stdev" in ln]
    r = parse_wrk("\n".join(lines))
    assert r.p50_ms != r.p50_ms and r.p99_ms != r.p99_ms
    assert r.requests == 31395
