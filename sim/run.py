"""Run one workload through several routing policies on identical arrivals."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence

from loadgen.results import RunResult, Slo
from loadgen.trace import TraceRequest
from policies.routing.registry import create_policy
from policies.scaling import create_policy as create_scaling_policy
from sim.autoscale import SimAutoscaler
from sim.build import EngineSpec, FleetReplicas, cold_start_s, job_factory, replica_factory
from sim.fleet import FleetSim

Workload = Callable[[], Iterable[TraceRequest]]


def simulate(workload: Workload, spec: EngineSpec, replicas: int, policy: str, seed: int = 0,
             scrape_interval_s: float | None = None, slo: Slo | None = None,
             autoscale: str | None = None, cold_start: float | None = None,
             fleet: FleetReplicas | None = None) -> RunResult:
    """One run: `workload()` is called afresh so every policy sees the same arrivals.

    With `fleet` (unlike replicas, e.g. a fleet file's) the replicas are those instead of
    `replicas` copies of `spec`.

    With `autoscale` (a scaling policy spec) the fleet starts with `replicas` and scales; new
    replicas become ready `cold_start` seconds after launch (default: the perf model's cold
    start for the engine's model)."""
    scaler = None
    if autoscale:
        start_s = cold_start if cold_start is not None else cold_start_s(spec)
        scaler = SimAutoscaler(create_scaling_policy(autoscale), cold_start_s=start_s)
    make_replica = fleet.make_replica if fleet else replica_factory(spec, seed)
    sim = FleetSim(make_replica=make_replica, num_replicas=fleet.count if fleet else replicas,
                   policy=create_policy(policy, rng=random.Random(seed)), make_job=job_factory(spec),
                   scrape_interval_s=scrape_interval_s, slo=slo, autoscaler=scaler,
                   weights=fleet.weights if fleet else ())
    result = sim.run(workload(), label=policy if not autoscale else f"{policy} + {autoscale}")
    result.meta.update({"engine": spec.kind, "model": spec.model, "gpu": spec.gpu, "seed": seed,
                        "scrape_interval_s": scrape_interval_s})
    return result


def compare(workload: Workload, spec: EngineSpec, replicas: int, policies: Sequence[str], seed: int = 0,
            scrape_interval_s: float | None = None, slo: Slo | None = None,
            autoscale: Sequence[str] = (), cold_start: float | None = None,
            fleet: FleetReplicas | None = None) -> list[RunResult]:
    """Every routing policy, times every scaling policy when some are given, on the same arrivals."""
    scalers: Sequence[str | None] = list(autoscale) or [None]
    return [simulate(workload, spec, replicas, p, seed, scrape_interval_s, slo, a, cold_start, fleet)
            for p in policies for a in scalers]
