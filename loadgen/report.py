"""Plain-text tables: one run's summary, and several runs side by side."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from loadgen.results import LatencyStats, RunResult, Summary

_LATENCIES = (("TTFT", "ttft_s"), ("TPOT", "tpot_s"), ("ITL", "itl_s"), ("E2E", "e2e_s"))


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(str(c).rjust(w) if i else str(c).ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
             for r in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def latency_table(summary: Summary) -> str:
    """mean, p50, p90 and p99 of TTFT, TPOT, ITL and E2E, in milliseconds."""
    rows = []
    for label, name in _LATENCIES:
        stats: LatencyStats = getattr(summary, name)
        rows.append([f"{label} (ms)", _ms(stats.mean), _ms(stats.p50), _ms(stats.p90), _ms(stats.p99)])
    return _table(["latency", "mean", "p50", "p90", "p99"], rows)


def _goodput(s: Summary) -> str:
    return "-" if s.goodput_per_s is None else f"{s.goodput_per_s:.2f}"


# compare-table rows: label -> how to print it from a summary
_FIGURES: tuple[tuple[str, Callable[[Summary], str]], ...] = (
    ("requests ok / sent", lambda s: f"{s.num_ok}/{s.num_requests}"),
    ("duration (s)", lambda s: f"{s.duration_s:.1f}"),
    ("throughput (req/s)", lambda s: f"{s.request_throughput_per_s:.2f}"),
    ("output (tok/s)", lambda s: f"{s.output_throughput_tok_per_s:.1f}"),
    ("total (tok/s)", lambda s: f"{s.total_throughput_tok_per_s:.1f}"),
    ("goodput (req/s)", _goodput),
    ("prefix hit rate", lambda s: f"{100 * s.prefix_hit_rate:.1f}%"),
    ("prompt tokens", lambda s: str(s.total_prompt_tokens)),
    ("completion tokens", lambda s: str(s.total_completion_tokens)),
    ("max send lateness (ms)", lambda s: _ms(s.max_lateness_s)),
)


def _share(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _scale_events(events: Sequence[dict[str, Any]] | None) -> str:
    if events is None:
        return "-"
    return f"{sum(e['direction'] == 'up' for e in events)} up / {sum(e['direction'] == 'down' for e in events)} down"


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


# cost rows: label -> how to print it from a result (meta for cost, summary for the SLO share)
_COST: tuple[tuple[str, Callable[[RunResult], str]], ...] = (
    ("SLO attainment", lambda r: _share(r.summary.slo_attainment)),
    ("replica-seconds", lambda r: _seconds(r.meta.get("replica_seconds"))),
    ("GPU-seconds", lambda r: _seconds(r.meta.get("gpu_seconds"))),
    ("scale events", lambda r: _scale_events(r.meta.get("scale_events"))),
    ("cold starts", lambda r: "-" if r.meta.get("cold_starts") is None else str(r.meta["cold_starts"])),
)


def summary_table(result: RunResult) -> str:
    """The figures of one run and its latency table."""
    s = result.summary
    rows = [[label, fmt(s)] for label, fmt in _FIGURES] + [[label, fmt(result)] for label, fmt in _COST]
    if s.slo is not None:
        bounds = (("ttft", s.slo.ttft_s), ("tpot", s.slo.tpot_s), ("e2e", s.slo.e2e_s))
        rows.append(["goodput SLO (s)", ",".join(f"{k}={v:g}" for k, v in bounds if v is not None)])
    rows += [["backend " + name, str(n)] for name, n in s.requests_per_backend.items()]
    return f"{_table(['run', result.label], rows)}\n\n{latency_table(s)}"


def _time_base(result: RunResult) -> str:
    """`modelled (/0.05)`, `wall`, or `-` for a file that does not say (e.g. the simulator's)."""
    base, scale = result.meta.get("time_base"), result.meta.get("time_scale")
    return f"modelled (/{scale:g})" if base == "modelled" and scale else str(base or "-")


def compare_table(results: Sequence[RunResult]) -> str:
    """Several runs side by side: one column per run, one row per figure."""
    rows = [[label] + [fmt(r.summary) for r in results] for label, fmt in _FIGURES]
    rows += [[label] + [fmt(r) for r in results] for label, fmt in _COST]
    if any("time_base" in r.meta for r in results):  # figures in different clocks do not compare
        rows.insert(0, ["time base"] + [_time_base(r) for r in results])
    for label, name in _LATENCIES:
        for pct in ("p50", "p90", "p99"):
            rows.append([f"{label} {pct} (ms)"] + [_ms(getattr(getattr(r.summary, name), pct)) for r in results])
    return _table(["figure", *(r.label for r in results)], rows)
