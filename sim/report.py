"""The comparison table `flotilla sim` prints: one row per policy on the same arrivals."""

from __future__ import annotations

from collections.abc import Sequence

from loadgen.results import RunResult


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1e3:.1f}"


def comparison_table(results: Sequence[RunResult]) -> str:
    width = max([len("policy"), *(len(r.label) for r in results)])
    head = (f"{'policy':<{width}} {'reqs':>6} {'TTFT mean':>10} {'TTFT p99':>9} {'E2E mean':>9} {'E2E p90':>9} "
            f"{'E2E max':>9} {'hit rate':>8} {'peak replicas':>13}  prefill tokens per replica")
    lines = [head, "-" * len(head)]
    for r in results:
        s, m = r.summary, r.meta
        lines.append(
            f"{r.label:<{width}} {s.num_requests:>6} {_ms(s.ttft_s.mean):>10} {_ms(s.ttft_s.p99):>9} "
            f"{_ms(s.e2e_s.mean):>9} {_ms(s.e2e_s.p90):>9} {_ms(m.get('e2e_max_s')):>9} "
            f"{100 * m.get('hit_rate', 0.0):>7.1f}% {m.get('peak_ready_replicas', '-'):>13}  "
            f"{m.get('prefill_tokens_per_replica')}")
    lines.append("latencies in ms of virtual time")
    return "\n".join(lines)
