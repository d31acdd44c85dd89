"""`cold-start-aware`: plan for the queue the fleet will have when new capacity can arrive.

Every `interval_s`:

1. the arrival rate r is the mean over the last interval (optionally extended by its trend);
2. replicas already starting count as capacity in progress: each serves from its launch time
   plus the measured cold start (`cold_start_s` until one has been measured);
3. the queue is projected second by second from now to now + cold start, the earliest moment a
   replica launched now could serve: q(H) = max(0, q + r - ready capacity), capacity rising as
   the starting replicas arrive;
4. desired = ceil((r + q(H) / drain_s) / (target_utilization x capacity_rps)), so replicas are
   added only for the backlog that capacity already on its way will not have absorbed.

It never scales down while any replica is loading, and to scale down it drains the ready replicas
whose loss costs least: fewest in-flight requests, then fewest unique cached prefixes plus
pinned sessions, then the newest.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from policies.scaling.base import (
    ConfigError,
    FleetState,
    Reason,
    Recommendation,
    ReplicaState,
    ScalingPolicy,
    ScalingSignals,
    compare,
    window_mean,
)
from policies.scaling.registry import register_policy
from policies.scaling.seed import check_rate_model


@dataclass(frozen=True)
class ColdStartAwareConfig:
    capacity_rps: float = 2.0
    """Requests per second one replica serves."""
    target_utilization: float = 0.8
    """Share of a replica's capacity to plan for, in (0, 1]."""
    drain_s: float = 60.0
    """Seconds in which the projected backlog should be worked off once new capacity serves."""
    interval_s: float = 30.0
    """Seconds between decisions; the arrival rate is averaged over this window."""
    cold_start_s: float = 60.0
    """Cold start assumed until the fleet has measured one (seconds)."""
    trend: bool = False
    """Extend the arrival rate by its rise since the previous interval (never by a fall)."""

    def __post_init__(self) -> None:
        check_rate_model(self.capacity_rps, self.target_utilization, self.drain_s, self.interval_s)
        if self.cold_start_s < 0:
            raise ConfigError("cold_start_s", self.cold_start_s, "must be >= 0")


@register_policy("cold-start-aware", config=ColdStartAwareConfig)
class ColdStartAwarePolicy(ScalingPolicy):
    """Adds what the queue projected to the end of a cold start needs; never drains a loading replica."""

    config: ColdStartAwareConfig

    def recommend(self, history: Sequence[ScalingSignals], fleet: FleetState) -> Recommendation:
        cfg = self.config
        rate = self._rate(history, fleet.now_s)
        if rate is None:
            return Recommendation(fleet.current, Reason.NO_SIGNAL, "no arrival rate in the last interval")
        cold_s = fleet.cold_start_s if fleet.cold_start_s is not None else cfg.cold_start_s
        projected = self.project_queue(history[-1].waiting, rate, fleet, cold_s)
        desired = math.ceil((rate + projected / cfg.drain_s) / (cfg.target_utilization * cfg.capacity_rps))
        detail = (f"rate {rate:.2f}/s, queue projected to {projected:.0f} in {cold_s:g} s"
                  f" with {fleet.starting} starting: ceil(({rate:.2f} + {projected:.0f}/{cfg.drain_s:g})"
                  f" / {cfg.target_utilization * cfg.capacity_rps:g}) = {desired}")
        if desired < fleet.current and fleet.starting:
            return Recommendation(fleet.current, Reason.STARTING_HOLD, f"{detail}; replicas are loading")
        return Recommendation(desired, compare(desired, fleet.current), detail)

    def _rate(self, history: Sequence[ScalingSignals], now_s: float) -> float | None:
        interval = self.config.interval_s
        rate = window_mean(history, "arrival_rate_rps", now_s, interval)
        if rate is None or not self.config.trend:
            return rate
        before = window_mean(history, "arrival_rate_rps", now_s - interval, interval)
        return rate + max(0.0, rate - (before if before is not None else rate))

    def project_queue(self, waiting: float, rate: float, fleet: FleetState, cold_start_s: float) -> float:
        """Requests waiting `cold_start_s` from now if `rate` keeps arriving and the starting
        replicas come up on schedule (one-second fluid steps)."""
        serving_from = sorted(self._serving_from(fleet, cold_start_s))
        queue = waiting
        for step in range(math.ceil(cold_start_s)):
            t = fleet.now_s + 1 + step
            serving = sum(1 for s in serving_from if s <= t)
            queue = max(0.0, queue + rate - serving * self.config.capacity_rps)
        return queue

    @staticmethod
    def _serving_from(fleet: FleetState, cold_start_s: float) -> list[float]:
        times = []
        for r in fleet.replicas:
            if r.state is ReplicaState.READY:
                times.append(-math.inf)
            elif r.state is ReplicaState.STARTING:
                times.append(r.started_at_s + cold_start_s)
        return times

    def choose_drain(self, fleet: FleetState, count: int) -> list[str]:
        """Cheapest ready replicas to lose; a starting replica is never chosen."""
        ready = sorted(fleet.in_state(ReplicaState.READY), key=lambda r: (
            r.in_flight, r.unique_cached_prefixes + r.pinned_sessions, -r.started_at_s, r.replica_id))
        return [r.replica_id for r in ready[:count]]
