"""Run one workload through several routing policies on identical arrivals."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from loadgen.results import RunResult, Slo
from loadgen.trace import TraceRequest
from policies.routing.registry import create_policy
from sim.build import EngineSpec, FleetReplicas, engine_replicas, job_factory, simulated_autoscaler
from sim.fleet import KV_EVENTS_DELAY_S, FleetSim, Replica
from sim.replicas import Listener

Workload = Callable[[], Iterable[TraceRequest]]
NO_AUTOSCALE = "none"
"""The `--autoscale` value of a fixed fleet, compared side by side with scaling policies."""


def simulate(workload: Workload, spec: EngineSpec, replicas: int, policy: str, seed: int = 0,
             scrape_interval_s: float | None = None, slo: Slo | None = None,
             autoscale: str | None = None, cold_start: float | None = None,
             fleet: FleetReplicas | None = None, kv_events_delay_s: float = KV_EVENTS_DELAY_S) -> RunResult:
    """One run: `workload()` is called afresh so every policy sees the same arrivals.

    With `fleet` (unlike replicas, e.g. a fleet file's) the replicas are those instead of
    `replicas` copies of `spec`.

    With `autoscale` (a scaling policy spec) the fleet starts with its replicas and scales (a fleet
    file's scaled group only, between its min and max); new replicas become ready `cold_start`
    seconds after launch (default: the perf model's cold start for the engine's model).
    `meta.engines` lists every replica the run built, with its resolved engine config.

    A policy that reads a KV index (precise-prefix) gets one fed by the engines' KV events,
    `kv_events_delay_s` after each step (`meta.kv_events_delay_s`)."""
    members = fleet or engine_replicas(spec, replicas, seed)
    scaler = simulated_autoscaler(members, autoscale, cold_start, spec) if autoscale else None
    built: list[dict[str, Any]] = []

    def make_replica(index: int, listener: Listener) -> Replica:
        built.append(members.describe(index))
        return members.make_replica(index, listener)

    sim = FleetSim(make_replica=make_replica, num_replicas=members.count,
                   policy=create_policy(policy, rng=random.Random(seed)),
                   make_job=job_factory(spec if fleet is None else None),
                   scrape_interval_s=scrape_interval_s, slo=slo, autoscaler=scaler, weights=members.weights,
                   default_weight=members.scaled_weight, gpus_of=members.gpus,
                   kv_events_delay_s=kv_events_delay_s)
    label = f"{policy} + {autoscale}" if autoscale else policy
    result = sim.run(workload(), label=label)
    engine = {"engine": spec.kind, "model": spec.model, "gpu": spec.gpu} if fleet is None else {"engine": "fleet"}
    result.meta.update({**engine, "seed": seed, "scrape_interval_s": scrape_interval_s, "engines": built})
    if sim.kv_index is not None:
        result.meta["kv_events_delay_s"] = kv_events_delay_s
    return result


def compare(workload: Workload, spec: EngineSpec, replicas: int, policies: Sequence[str], seed: int = 0,
            scrape_interval_s: float | None = None, slo: Slo | None = None,
            autoscale: Sequence[str] = (), cold_start: float | None = None,
            fleet: FleetReplicas | None = None, kv_events_delay_s: float = KV_EVENTS_DELAY_S) -> list[RunResult]:
    """Every routing policy, times every scaling policy when some are given, on the same arrivals.
    The scaling policy `none` is the fixed fleet the run starts with."""
    scalers: Sequence[str | None] = list(autoscale) or [None]
    results = []
    for p in policies:
        for a in scalers:
            fixed = a is not None and a.strip() == NO_AUTOSCALE
            result = simulate(workload, spec, replicas, p, seed, scrape_interval_s, slo, None if fixed else a,
                              cold_start, fleet,
                              kv_events_delay_s=kv_events_delay_s)
            if fixed:
                result.meta.update(label=f"{p} + {NO_AUTOSCALE}", autoscale=NO_AUTOSCALE)
            results.append(result)
    return results
