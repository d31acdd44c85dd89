"""Run one workload through several routing policies on identical arrivals."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence

from loadgen.results import RunResult, Slo
from loadgen.trace import TraceRequest
from policies.routing.registry import create_policy
from sim.build import EngineSpec, job_factory, replica_factory
from sim.fleet import FleetSim

Workload = Callable[[], Iterable[TraceRequest]]


def simulate(workload: Workload, spec: EngineSpec, replicas: int, policy: str, seed: int = 0,
             scrape_interval_s: float | None = None, slo: Slo | None = None) -> RunResult:
    """One run: `workload()` is called afresh so every policy sees the same arrivals."""
    sim = FleetSim(make_replica=replica_factory(spec, seed), num_replicas=replicas,
                   policy=create_policy(policy, rng=random.Random(seed)), make_job=job_factory(spec),
                   scrape_interval_s=scrape_interval_s, slo=slo)
    result = sim.run(workload(), label=policy)
    result.meta.update({"engine": spec.kind, "model": spec.model, "gpu": spec.gpu, "seed": seed,
                        "scrape_interval_s": scrape_interval_s})
    return result


def compare(workload: Workload, spec: EngineSpec, replicas: int, policies: Sequence[str], seed: int = 0,
            scrape_interval_s: float | None = None, slo: Slo | None = None) -> list[RunResult]:
    return [simulate(workload, spec, replicas, p, seed, scrape_interval_s, slo) for p in policies]
