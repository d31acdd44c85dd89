"""The comparison table `flotilla sim` prints: one row per policy on the same arrivals."""

from __future__ import annotations

from collections.abc import Sequence

from loadgen.results import RunResult


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1e3:.1f}"


def _share(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def _seconds(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}"


def _ups_downs(events: Sequence[dict] | None) -> str:  # type: ignore[type-arg]
    events = events or []
    return f"{sum(e['direction'] == 'up' for e in events)}/{sum(e['direction'] == 'down' for e in events)}"


def comparison_table(results: Sequence[RunResult]) -> str:
    width = max([len("policy"), *(len(r.label) for r in results)])
    head = (f"{'policy':<{width}} {'reqs':>6} {'SLO met':>7} {'TTFT mean':>10} {'TTFT p99':>9} {'E2E mean':>9} "
            f"{'E2E p90':>9} {'E2E max':>9} {'hit rate':>8} {'peak replicas':>13} {'replica-s':>9} "
            f"{'GPU-s':>8} {'up/down':>7} {'cold':>4}  prefill tokens per replica")
    lines = [head, "-" * len(head)]
    for r in results:
        s, m = r.summary, r.meta
        lines.append(
            f"{r.label:<{width}} {s.num_requests:>6} {_share(s.slo_attainment):>7} {_ms(s.ttft_s.mean):>10} "
            f"{_ms(s.ttft_s.p99):>9} {_ms(s.e2e_s.mean):>9} {_ms(s.e2e_s.p90):>9} {_ms(m.get('e2e_max_s')):>9} "
            f"{100 * m.get('hit_rate', 0.0):>7.1f}% {m.get('peak_ready_replicas', '-'):>13} "
            f"{_seconds(m.get('replica_seconds')):>9} {_seconds(m.get('gpu_seconds')):>8} "
            f"{_ups_downs(m.get('scale_events')):>7} {m.get('cold_starts', '-'):>4}  "
            f"{m.get('prefill_tokens_per_replica')}")
    lines.append("latencies in ms of virtual time; SLO met: share of requests within every --slo bound; "
                 "replica-s, GPU-s: paid from launch to stop; up/down: scale events; cold: cold starts")
    return "\n".join(lines)


def _rate(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def pd_table(results: Sequence[RunResult]) -> str:
    """Colocated and P/D fleets on the same arrivals: latency percentiles, goodput, GPUs."""
    width = max([len("fleet"), *(len(r.label) for r in results)])
    head = (f"{'fleet':<{width}} {'GPUs':>4} {'reqs':>5} {'TTFT p50':>9} {'TTFT p90':>9} {'TTFT p99':>9} "
            f"{'TPOT p50':>9} {'TPOT p90':>9} {'TPOT p99':>9} {'SLO met':>7} {'goodput/s':>9} "
            f"{'per GPU':>8} {'GPU-s':>8} {'KV pull mean':>12}")
    lines = [head, "-" * len(head)]
    for r in results:
        s, m = r.summary, r.meta
        gpus = m.get("gpus")
        per_gpu = s.goodput_per_s / gpus if s.goodput_per_s is not None and gpus else None
        pull = (m.get("kv_transfer") or {}).get("mean_s")
        lines.append(
            f"{r.label:<{width}} {gpus if gpus is not None else '-':>4} {s.num_requests:>5} "
            f"{_ms(s.ttft_s.p50):>9} {_ms(s.ttft_s.p90):>9} {_ms(s.ttft_s.p99):>9} {_ms(s.tpot_s.p50):>9} "
            f"{_ms(s.tpot_s.p90):>9} {_ms(s.tpot_s.p99):>9} {_share(s.slo_attainment):>7} "
            f"{_rate(s.goodput_per_s):>9} {_rate(per_gpu):>8} {_seconds(m.get('gpu_seconds')):>8} {_ms(pull):>12}")
    lines.append("latencies in ms of virtual time; goodput: requests per second within every --slo bound "
                 "(per GPU: over the fleet's GPUs); KV pull: prefill done to KV loaded on the decode "
                 "replica, link sharing included")
    return "\n".join(lines)
