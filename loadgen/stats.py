"""Serving statistics over request records, with vLLM benchmark_serving's definitions.

Percentiles use numpy's default linear interpolation, as benchmark_serving does. Goodput
counts successful requests whose TTFT, TPOT and E2E are all within the SLOs (a request with a
single output token has no TPOT and passes that check, as in benchmark_serving).
"""

from __future__ import annotations

import itertools
from array import array
from collections import Counter
from collections.abc import Sequence

import numpy as np

from loadgen.results import LatencyStats, RequestRecord, Slo, Summary

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


def latency_stats(samples: Sequence[float]) -> LatencyStats:
    """Mean, p50, p90 and p99 of `samples`; all None when there are none."""
    if len(samples) == 0:
        return LatencyStats()
    return _stats_in_place(np.array(samples, dtype=float))


def _stats_in_place(arr: np.ndarray) -> LatencyStats:
    # the mean first, in the samples' order; the percentiles then reorder `arr` instead of a copy
    # of it, which for a long run's gaps is hundreds of megabytes
    mean = float(arr.mean())
    p50, p90, p99 = (float(v) for v in np.percentile(arr, [50, 90, 99], overwrite_input=True))
    return LatencyStats(mean=mean, p50=p50, p90=p90, p99=p99)


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


def _gap_stats(records: Sequence[RequestRecord]) -> LatencyStats:
    gaps = _all_gaps(records)
    return _stats_in_place(gaps) if len(gaps) else LatencyStats()


def _all_gaps(records: Sequence[RequestRecord]) -> np.ndarray:
    # a long run holds tens of millions of gaps: one array, without a list of them all first
    if records and all(isinstance(r.itl_s, array) for r in records):  # the simulator's: no copy per gap
        return np.concatenate([np.frombuffer(r.itl_s, dtype=float) for r in records])  # type: ignore[call-overload]
    count = sum(len(r.itl_s) for r in records)
    return np.fromiter(itertools.chain.from_iterable(r.itl_s for r in records), dtype=float, count=count)


def summarize(records: Sequence[RequestRecord], slo: Slo | None = None,
              duration_s: float | None = None) -> Summary:
    """The `Summary` of a run; `duration_s` defaults to `run_duration_s(records)`."""
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
        ttft_s=latency_stats([r.ttft_s for r in ok if r.ttft_s is not None]),
        tpot_s=latency_stats([r.tpot_s for r in ok if r.tpot_s is not None]),
        itl_s=_gap_stats(ok),
        e2e_s=latency_stats([r.e2e_s for r in ok if r.e2e_s is not None]),
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
