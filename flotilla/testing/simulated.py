"""A fleet under the simulator's virtual clock, with the live fleet's `replay` interface."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from flotilla.testing.engines import sim_replica_factory
from flotilla.testing.spec import FleetSpec
from flotilla.testing.workload import ReplayOptions, Workload, load_workload
from loadgen.results import RunResult, Slo
from policies.routing.registry import create_policy
from sim.build import EngineSpec, job_factory
from sim.fleet import FleetSim


@dataclass
class SimFleet:
    """`spec` run by `sim.fleet.FleetSim`: each replay starts from empty engines and a fresh policy."""

    spec: FleetSpec
    """The fleet."""
    source: str = "sim"
    """Where results come from: `sim` here, `live` for `LiveFleet`."""

    @classmethod
    async def start(cls, spec: FleetSpec) -> SimFleet:
        """Check the spec by building the policy and one replica, as a live start would fail."""
        create_policy(spec.policy, rng=random.Random(spec.seed))
        sim_replica_factory(spec)(0, _NoListener())
        return cls(spec)

    async def replay(self, workload: Workload, **options: Any) -> RunResult:
        """Replay `workload` and return the loadgen result, latencies in modelled seconds."""
        opts = ReplayOptions.from_kwargs(**options)
        requests = load_workload(workload, opts)
        slo = opts.slo if isinstance(opts.slo, Slo) else None
        sim = FleetSim(make_replica=sim_replica_factory(self.spec), num_replicas=self.spec.engines,
                       policy=create_policy(self.spec.policy, rng=random.Random(self.spec.seed)),
                       make_job=job_factory(EngineSpec(kind=self.spec.flavor)),
                       scrape_interval_s=self.spec.scrape_interval_s, slo=slo)
        label = opts.label or self.spec.policy
        result = sim.run(requests, label=label)
        result.meta.update(fleet_meta(self.spec, "sim", label))
        return result

    async def close(self) -> None:
        """Nothing to release; here so both fleets tear down alike."""


class _NoListener:
    def on_token(self, *args: object, **kwargs: object) -> None:
        pass

    def on_tokens(self, *args: object, **kwargs: object) -> None:
        pass

    def on_finish(self, *args: object, **kwargs: object) -> None:
        pass

    def on_reject(self, *args: object, **kwargs: object) -> None:
        pass


def fleet_meta(spec: FleetSpec, source: str, label: str) -> dict[str, Any]:
    """What a result records about the fleet it came from."""
    return {"label": label, "source": source, "policy": spec.policy, "flavor": spec.flavor, "model": spec.model,
            "gpu": spec.gpu, "replicas": spec.engines, "seed": spec.seed, "time_unit": "modelled seconds"}
