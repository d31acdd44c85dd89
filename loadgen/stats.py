"""Serving statistics over request records, with vLLM benchmark_serving's definitions.

Percentiles use numpy's default linear interpolation, as benchmark_serving does. Goodput
counts successful requests whose TTFT, TPOT and E2E are all within the SLOs (a request with a
single output token has no TPOT and passes that check, as in benchmark_serving).
"""

from __future__ import annotations

import dataclasses
import itertools
from array import array
from collections import Counter
from collections.abc import Sequence

import numpy as np

from loadgen.results import LatencyStats, RequestRecord, RunResult, Slo, Summary

_SLO_KEYS = {"ttft": "ttft_s", "tpot": "tpot_s", "e2e": "e2e_s", "e2el": "e2e_s"}


def parse_slo(spec: str) -> Slo:
    """`ttft=0.5,tpot=0.05,e2e=10` (seconds) to an `Slo`; unknown keys name the valid ones."""
    bounds: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        key, sep, value = part.partition("=")
        if not sep or key.strip() not in _SLO_KEYS:
            raise ValueError(f"bad SLO {part!r}: expected KEY=SECONDS with KEY in {sorted(_SLO_KEYS)}")
        seconds = float(value)
        if seconds <= 0:
            raise ValueError(f"SLO {key.strip()} must be > 0 seconds, got {value}")
        bounds[_SLO_KEYS[key.strip()]] = seconds
    return Slo(**bounds)


DEFAULT_PERCENTILES: tuple[float, ...] = (50.0, 90.0, 99.0)
"""The percentiles a summary lists when none are chosen (`--percentiles 50,90,99`)."""


def percentile_key(p: float) -> str:
    """`p99`, `p99.9`: the name vLLM's benchmark gives a percentile in its result keys."""
    return f"p{int(p)}" if int(p) == p else f"p{p}"


def parse_percentiles(spec: str) -> tuple[float, ...]:
    """`50,90,99,99.9` to percentiles; each must lie in (0, 100]."""
    try:
        values = tuple(float(part) for part in spec.split(",") if part.strip())
    except ValueError:
        raise ValueError(f"bad percentiles {spec!r}: expected numbers separated by commas, e.g. 50,90,99,99.9") from None
    bad = [v for v in values if not 0 < v <= 100]
    if not values or bad:
        raise ValueError(f"bad percentiles {spec!r}: each must be in (0, 100], e.g. 50,90,99,99.9")
    return tuple(dict.fromkeys(values))  # in the order given, without repeats


def latency_stats(samples: Sequence[float],
                  percentiles: Sequence[float] = DEFAULT_PERCENTILES) -> LatencyStats:
    """Mean, std, min, max, p50, p90, p99 and the chosen `percentiles` of `samples`; all None
    when there are none."""
    if len(samples) == 0:
        return LatencyStats()
    return _stats_in_place(np.array(samples, dtype=float), percentiles)


def _stats_in_place(arr: np.ndarray, percentiles: Sequence[float] = DEFAULT_PERCENTILES) -> LatencyStats:
    # mean and std first, in the samples' order; the percentiles then reorder `arr` instead of a
    # copy of it, which for a long run's gaps is hundreds of megabytes
    mean, std = float(arr.mean()), float(arr.std())
    qs = list(dict.fromkeys([50.0, 90.0, 99.0, 0.0, 100.0, *percentiles]))
    values = dict(zip(qs, (float(v) for v in np.percentile(arr, qs, overwrite_input=True)), strict=True))
    return LatencyStats(mean=mean, p50=values[50.0], p90=values[90.0], p99=values[99.0], std=std,
                        min=values[0.0], max=values[100.0],
                        percentiles={percentile_key(p): values[float(p)] for p in percentiles})


def meets_slo(rec: RequestRecord, slo: Slo) -> bool:
    """True when a successful request is within every bound of `slo`."""
    checks = ((rec.ttft_s, slo.ttft_s), (rec.tpot_s, slo.tpot_s), (rec.e2e_s, slo.e2e_s))
    return rec.ok and all(bound is None or value is None or value <= bound for value, bound in checks)


def run_duration_s(records: Sequence[RequestRecord]) -> float:
    """From the first send to the last completion (or send, for requests without one)."""
    if not records:
        return 0.0
    start = min(r.send_time_s for r in records)
    end = max(r.send_time_s + (r.e2e_s or 0.0) for r in records)
    return end - start


def _gap_stats(records: Sequence[RequestRecord], percentiles: Sequence[float]) -> LatencyStats:
    gaps = _all_gaps(records)
    return _stats_in_place(gaps, percentiles) if len(gaps) else LatencyStats()


def _all_gaps(records: Sequence[RequestRecord]) -> np.ndarray:
    # a long run holds tens of millions of gaps: one array, without a list of them all first
    if records and all(isinstance(r.itl_s, array) for r in records):  # the simulator's: no copy per gap
        return np.concatenate([np.frombuffer(r.itl_s, dtype=float) for r in records])  # type: ignore[call-overload]
    count = sum(len(r.itl_s) for r in records)
    return np.fromiter(itertools.chain.from_iterable(r.itl_s for r in records), dtype=float, count=count)


def summarize(records: Sequence[RequestRecord], slo: Slo | None = None,
              duration_s: float | None = None,
              percentiles: Sequence[float] = DEFAULT_PERCENTILES) -> Summary:
    """The `Summary` of a run; `duration_s` defaults to `run_duration_s(records)`; every latency
    lists `percentiles` besides its p50, p90 and p99."""
    ok = [r for r in records if r.ok]
    duration = run_duration_s(records) if duration_s is None else duration_s
    per_s = 1.0 / duration if duration > 0 else 0.0
    prompt = sum(r.prompt_tokens for r in records)
    completion = sum(r.completion_tokens for r in records)
    cached = sum(r.cached_tokens for r in records)
    backends = Counter(r.backend or "unknown" for r in ok)
    met = 0 if slo is None else sum(meets_slo(r, slo) for r in ok)
    return Summary(
        num_requests=len(records), num_ok=len(ok), num_failed=len(records) - len(ok),
        duration_s=duration,
        ttft_s=latency_stats([r.ttft_s for r in ok if r.ttft_s is not None], percentiles),
        tpot_s=latency_stats([r.tpot_s for r in ok if r.tpot_s is not None], percentiles),
        itl_s=_gap_stats(ok, percentiles),
        e2e_s=latency_stats([r.e2e_s for r in ok if r.e2e_s is not None], percentiles),
        total_prompt_tokens=prompt, total_completion_tokens=completion, total_cached_tokens=cached,
        request_throughput_per_s=len(ok) * per_s,
        output_throughput_tok_per_s=completion * per_s,
        total_throughput_tok_per_s=(prompt + completion) * per_s,
        slo=slo,
        goodput_per_s=None if slo is None else met * per_s,
        slo_attainment=None if slo is None or not records else met / len(records),
        prefix_hit_rate=cached / prompt if prompt else 0.0,
        requests_per_backend=dict(sorted(backends.items())),
        max_lateness_s=max((r.lateness_s for r in records), default=0.0),
    )


def with_percentiles(result: RunResult, percentiles: Sequence[float]) -> RunResult:
    """`result` summarized again with `percentiles` (same records, SLO and duration)."""
    s = result.summary
    if tuple(percentiles) == DEFAULT_PERCENTILES:
        return result
    return dataclasses.replace(result, summary=summarize(result.requests, s.slo, s.duration_s, percentiles))
