"""A fleet under the simulator's virtual clock, with the live fleet's `replay` interface."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from flotilla.fleet import Fleet
from flotilla.testing.spec import FleetSpec
from flotilla.testing.workload import ReplayOptions, Workload, load_workload
from loadgen.results import RunResult, Slo
from policies.routing.registry import create_policy
from sim.build import FleetReplicas, fleet_replicas, job_factory
from sim.fleet import FleetSim, Replica
from sim.replicas import Listener


@dataclass
class SimFleet:
    """A fleet run by `sim.fleet.FleetSim`: each replay starts from empty engines and a fresh policy."""

    fleet: Fleet
    """The fleet model it runs."""
    spec: FleetSpec | None = None
    """The keywords it was built from; None for a fleet file's fleet."""
    source: str = "sim"
    """Where results come from: `sim` here, `live` for `LiveFleet`."""

    @classmethod
    async def start(cls, spec: FleetSpec | Fleet) -> SimFleet:
        """Check the fleet by building the policy and every engine, as a live start would fail."""
        fleet = spec if isinstance(spec, Fleet) else spec.fleet()
        create_policy(fleet.policy, rng=random.Random(fleet.seed))
        fleet_replicas(fleet)
        return cls(fleet, spec if isinstance(spec, FleetSpec) else None)

    async def replay(self, workload: Workload, **options: Any) -> RunResult:
        """Replay `workload` and return the loadgen result, latencies in modelled seconds."""
        opts = ReplayOptions.from_kwargs(**options)
        requests = load_workload(workload, opts)
        slo = opts.slo if isinstance(opts.slo, Slo) else self.fleet.slo
        replicas = fleet_replicas(self.fleet)
        built: list[dict[str, Any]] = []
        sim = FleetSim(make_replica=_recording(replicas, built), num_replicas=replicas.count,
                       policy=create_policy(self.fleet.policy, rng=random.Random(self.fleet.seed)),
                       make_job=job_factory(), scrape_interval_s=self.fleet.scrape_interval_s, slo=slo,
                       weights=replicas.weights)
        label = opts.label or self.fleet.policy
        result = sim.run(requests, label=label)
        result.meta.update(fleet_meta(self.fleet, "sim", label), engines=built)
        return result

    async def close(self) -> None:
        """Nothing to release; here so both fleets tear down alike."""


def _recording(replicas: FleetReplicas, built: list[dict[str, Any]]):  # type: ignore[no-untyped-def]
    def make(index: int, listener: Listener) -> Replica:
        built.append(replicas.describe(index))
        return replicas.make_replica(index, listener)

    return make


def _one(values: list[str]) -> str:
    return values[0] if len(set(values)) == 1 else ",".join(values)


def fleet_meta(fleet: Fleet | FleetSpec, source: str, label: str) -> dict[str, Any]:
    """What a result records about the fleet it came from (flavor, model and GPU joined by commas
    where the groups differ)."""
    fleet = fleet.fleet() if isinstance(fleet, FleetSpec) else fleet
    groups = fleet.engines
    return {"label": label, "source": source, "policy": fleet.policy, "flavor": _one([g.flavor for g in groups]),
            "model": _one([g.model for g in groups]), "gpu": _one([g.gpu for g in groups]),
            "replicas": len(fleet.started()), "seed": fleet.seed, "time_unit": "modelled seconds"}
