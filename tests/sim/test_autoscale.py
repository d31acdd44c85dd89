"""Autoscaling in the simulator: the real scaling policies on simulated cold starts."""

from __future__ import annotations

from loadgen.readers import read_trace
from loadgen.trace import TraceRequest
from sim.build import EngineSpec
from sim.run import compare, simulate
from tests.conftest import REPO

FIXED = EngineSpec(kind="fixed")


def _step_load(rate_before: float, rate_after: float, step_at_s: float, end_s: float,
               service_s: float) -> list[TraceRequest]:
    """Evenly spaced arrivals whose rate steps up at `step_at_s`: deterministic, no sampling."""
    reqs, t = [], 0.0
    while t < end_s:
        reqs.append(TraceRequest(timestamp_s=round(t, 6), input_length=16, output_length=1,
                                 service_time_s=service_s))
        t += 1.0 / (rate_before if t < step_at_s else rate_after)
    return reqs


def test_fleet_grows_after_a_load_step_and_every_request_completes() -> None:
    load = _step_load(1.0, 4.0, step_at_s=60, end_s=240, service_s=0.5)  # 2 req/s per replica
    result = simulate(lambda: load, FIXED, replicas=1, policy="least-outstanding",
                      autoscale="seed:capacity_rps=2,interval_s=30", cold_start=30)
    assert result.summary.num_ok == len(load)
    assert result.meta["peak_ready_replicas"] >= 3  # 4 req/s / (0.8 x 2) = 2.5 -> 3
    counts = [n for _, n in result.replicas]
    assert counts[0] == 1 and max(counts) == result.meta["peak_ready_replicas"]


def _example18_ramp() -> list[TraceRequest]:
    """The seed's Example 18 load as discrete requests (tests/data/seed/example18.jsonl): evenly
    spaced arrivals at 2 req/s, ramping to 8 between 120 and 240 s, 0.5 s of service each."""
    return list(read_trace(REPO / "tests" / "data" / "seed" / "example18.jsonl"))


def test_long_cold_start_overshoots_with_the_seed_rule_but_not_cold_start_aware() -> None:
    load = _example18_ramp()
    seed, aware = compare(lambda: load, FIXED, 1, ["least-outstanding"],
                          autoscale=["seed:capacity_rps=2", "cold-start-aware:capacity_rps=2"], cold_start=190)
    # Example 18 with a 190 s cold start: the seed rule overshoots to 14 replicas where 5 carry the load
    assert seed.meta["peak_ready_replicas"] == 14
    assert aware.meta["peak_ready_replicas"] <= 10
    assert aware.meta["peak_waiting"] <= seed.meta["peak_waiting"]
    assert seed.summary.num_ok == aware.summary.num_ok == len(load)


def test_scale_from_zero_holds_requests_until_a_replica_is_ready() -> None:
    load = [TraceRequest(timestamp_s=1.0 + i * 0.01, input_length=16, output_length=1, service_time_s=0.1)
            for i in range(5)]
    result = simulate(lambda: load, FIXED, replicas=0, policy="round-robin",
                      autoscale="kpa:min_replicas=0,target=1", cold_start=20)
    assert result.summary.num_ok == 5
    first = result.requests[0]
    assert first.e2e_s is not None and first.e2e_s >= 20.0  # waited through the cold start
