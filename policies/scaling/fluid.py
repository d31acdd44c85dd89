"""The fluid what-if of the seed lesson's Example 18, driving any scaling policy object.

Requests are counted as fractions per second. Second `t` (t = 0, 1, ...) sees `rate(t)` arrivals;
the replicas ready at `t` serve `capacity_rps` each; the rest waits. The sample of second `t` is
stamped `at_s = t`, and at the end of every policy interval (t + 1 a multiple of it) the policy
decides with `now_s = t`. A replica added at `t` is ready at `t + cold_start_s`; a drained one
leaves at once (a fluid replica holds no requests of its own).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from policies.scaling.base import (
    ConfigError,
    FleetState,
    ReplicaInfo,
    ReplicaState,
    ScalingPolicy,
    ScalingSignals,
    require_positive,
)

# Samples kept for the policy; the longest built-in window is 300 s.
HISTORY_S = 600


@dataclass(frozen=True)
class RateProfile:
    """A piecewise-linear arrival rate through (time s, requests per second) points."""

    points: tuple[tuple[float, float], ...]
    """(t_s, rate_rps) with strictly increasing t_s; flat before the first and after the last."""

    def __post_init__(self) -> None:
        if not self.points:
            raise ConfigError("rate", self.points, "needs at least one time:rps point")
        times = [t for t, _ in self.points]
        if any(b <= a for a, b in zip(times, times[1:], strict=False)):
            raise ConfigError("rate", self.points, "times must increase strictly")
        if any(r < 0 for _, r in self.points):
            raise ConfigError("rate", self.points, "rates must be >= 0")

    @classmethod
    def parse(cls, text: str) -> RateProfile:
        """Read `t:rps,t:rps,...`, e.g. `0:2,120:2,240:8,600:8`."""
        points = []
        for item in filter(None, (p.strip() for p in text.split(","))):
            t, sep, r = item.partition(":")
            try:
                points.append((float(t), float(r)))
            except ValueError:
                raise ConfigError("rate", item, "expected time:rps, e.g. 120:8") from None
            if not sep:
                raise ConfigError("rate", item, "expected time:rps, e.g. 120:8")
        return cls(tuple(points))

    def rate_at(self, t_s: float) -> float:
        """Requests per second at `t_s`."""
        pts = self.points
        if t_s < pts[0][0]:
            return pts[0][1]
        for (t0, r0), (t1, r1) in zip(pts, pts[1:], strict=False):
            if t0 <= t_s < t1:
                return r0 + (r1 - r0) * (t_s - t0) / (t1 - t0)
        return pts[-1][1]


@dataclass(frozen=True)
class FluidScenario:
    """The fleet and time span of one what-if run."""

    capacity_rps: float = 2.0
    """Requests per second one ready replica serves."""
    cold_start_s: float = 70.0
    """Seconds from a scale-up decision to the new replica serving."""
    duration_s: int = 600
    """Seconds simulated."""
    initial_ready: int = 1
    """Replicas ready at t = 0."""
    report_every_s: int = 60
    """A table row every this many seconds."""
    service_s: float = 1.0
    """Seconds one request occupies a replica; running requests = throughput x service_s."""

    def __post_init__(self) -> None:
        require_positive(self, "capacity_rps", "service_s")
        if self.cold_start_s < 0:
            raise ConfigError("cold_start_s", self.cold_start_s, "must be >= 0")
        if self.duration_s < 1:
            raise ConfigError("duration_s", self.duration_s, "must be >= 1")
        if self.initial_ready < 0:
            raise ConfigError("initial_ready", self.initial_ready, "must be >= 0")
        if self.report_every_s < 1:
            raise ConfigError("report_every_s", self.report_every_s, "must be >= 1")


@dataclass(frozen=True)
class FluidRow:
    """The fleet at the end of a reporting period."""

    t_s: int
    """End of the second just simulated (t + 1)."""
    rate_rps: float
    """Arrival rate of that second."""
    ready: int
    """Replicas that served in that second."""
    starting: int
    """Replicas launched but not yet ready, after that second's decision."""
    waiting: float
    """Requests queued at the end of that second."""


@dataclass(frozen=True)
class FluidRun:
    """One what-if run: the table and its peaks."""

    policy: str
    cold_start_s: float
    rows: tuple[FluidRow, ...]
    peak_waiting: float
    """Most requests queued at any second."""
    peak_queueing_delay_s: float
    """Largest queue / (ready x capacity): seconds the last waiting request waits."""
    peak_replicas: int
    """Most replicas (ready plus starting) at any second."""
    scale_ups: int
    """Decisions that added replicas."""


@dataclass
class _Replica:
    replica_id: str
    started_at_s: float
    ready_at_s: float

    def info(self, now_s: float) -> ReplicaInfo:
        if self.ready_at_s <= now_s:
            return ReplicaInfo(self.replica_id, ReplicaState.READY, self.started_at_s, self.ready_at_s)
        return ReplicaInfo(self.replica_id, ReplicaState.STARTING, self.started_at_s)


class _Fleet:
    """Mutable fleet of the what-if: the only place replicas are added and removed."""

    def __init__(self, initial_ready: int) -> None:
        self.replicas = [_Replica(f"r{i}", 0.0, 0.0) for i in range(initial_ready)]
        self.next_id = initial_ready
        self.last_scaled_at_s: float | None = None
        self.scale_ups = 0

    def ready(self, t: int) -> int:
        return sum(1 for r in self.replicas if r.ready_at_s <= t)

    def starting(self, t: int) -> int:
        return sum(1 for r in self.replicas if r.ready_at_s > t)

    def state(self, t: int, cold_start_s: float) -> FleetState:
        infos = tuple(r.info(t) for r in self.replicas)
        return FleetState(t, infos, cold_start_s, self.last_scaled_at_s)

    def apply(self, t: int, desired: int, drain: tuple[str, ...], cold_start_s: float) -> None:
        before = len(self.replicas)
        self.replicas = [r for r in self.replicas if r.replica_id not in drain]
        if desired > len(self.replicas):
            self.scale_ups += 1
        while len(self.replicas) < desired:
            self.replicas.append(_Replica(f"r{self.next_id}", t, t + cold_start_s))
            self.next_id += 1
        if len(self.replicas) != before:
            self.last_scaled_at_s = t


def simulate(policy: ScalingPolicy, rate: RateProfile, scenario: FluidScenario) -> FluidRun:
    """Run the fluid model for `scenario.duration_s` seconds under `policy`."""
    fleet = _Fleet(scenario.initial_ready)
    interval = max(1, round(policy.interval_s))
    history: list[ScalingSignals] = []
    rows: list[FluidRow] = []
    queue = peak_queue = peak_delay = 0.0
    peak_replicas = len(fleet.replicas)
    for t in range(scenario.duration_s):
        ready, arrivals = fleet.ready(t), rate.rate_at(t)
        served = min(queue + arrivals, ready * scenario.capacity_rps)
        queue = max(0.0, queue + arrivals - ready * scenario.capacity_rps)
        peak_queue = max(peak_queue, queue)
        peak_delay = max(peak_delay, _queueing_delay_s(queue, ready * scenario.capacity_rps))
        history.append(ScalingSignals(t, arrival_rate_rps=arrivals, num_requests_waiting=queue,
                                      num_requests_running=served * scenario.service_s))
        if (t + 1) % interval == 0:
            decision = policy.decide(history, fleet.state(t, scenario.cold_start_s))
            fleet.apply(t, decision.desired, decision.drain, scenario.cold_start_s)
            del history[:-HISTORY_S]
        peak_replicas = max(peak_replicas, len(fleet.replicas))
        if (t + 1) % scenario.report_every_s == 0:
            rows.append(FluidRow(t + 1, arrivals, ready, fleet.starting(t), queue))
    return FluidRun(policy.name, scenario.cold_start_s, tuple(rows), peak_queue, peak_delay,
                    peak_replicas, fleet.scale_ups)


def _queueing_delay_s(queue: float, serving_rps: float) -> float:
    if queue <= 0:
        return 0.0
    return queue / serving_rps if serving_rps > 0 else math.inf
