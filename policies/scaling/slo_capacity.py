"""`slo-capacity`: size the fleet from what one replica serves at the lengths arriving now,
keep queueing delay under the TTFT SLO, and give capacity back slowly, cheapest replica first.

Every `interval_s`:

1. One replica's rate mu is `target_utilization` x the capacity model's requests per second at
   the mean prompt and output lengths that arrived in the interval (the `replica_capacity_rps`
   signal; `capacity_rps` when no driver reports it). A 2,000-token prompt costs four times a
   500-token one: the count follows the work, not the request count.
2. need = ceil((r + w / (cold start + ttft_slo_s)) / mu), with r the arrival rate over the
   interval and w the requests waiting: the backlog that new replicas, arriving one cold start
   from now, must clear within the TTFT SLO.
3. The count is the largest need of the last `hold_s`, so a fleet sized for a burst stays for the
   next one (bursty traffic comes back) and does not pay a cold start again. It falls by at most
   `max_scale_down` replicas per decision, never while a replica is loading.
4. To shrink it drains the ready replicas whose loss costs least: fewest in-flight requests, then
   fewest unique cached prefixes plus pinned sessions (warm prefix caches stay), then the newest.
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
    window,
    window_mean,
)
from policies.scaling.registry import register_policy


@dataclass(frozen=True)
class SloCapacityConfig:
    target_utilization: float = 0.3
    """Share of the capacity model's full-batch rate one replica may carry and still meet the
    latency SLOs, in (0, 1]: full batches meet no TPOT SLO."""
    capacity_rps: float = 2.0
    """Full-batch requests per second of one replica when no driver reports `replica_capacity_rps`."""
    ttft_slo_s: float = 1.0
    """The TTFT SLO the queue is held to (seconds)."""
    cold_start_s: float = 60.0
    """Cold start assumed until the fleet has measured one (seconds)."""
    hold_s: float = 600.0
    """Seconds a need is remembered: the fleet shrinks only below every need of this window."""
    max_scale_down: int = 1
    """Most replicas one decision removes."""
    interval_s: float = 5.0
    """Seconds between decisions; the arrival rate is averaged over this window."""

    def __post_init__(self) -> None:
        if not 0 < self.target_utilization <= 1:
            raise ConfigError("target_utilization", self.target_utilization, "must be in (0, 1]")
        for name in ("capacity_rps", "ttft_slo_s", "interval_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(name, getattr(self, name), "must be > 0")
        for name in ("cold_start_s", "hold_s"):
            if getattr(self, name) < 0:
                raise ConfigError(name, getattr(self, name), "must be >= 0")
        if self.max_scale_down < 1:
            raise ConfigError("max_scale_down", self.max_scale_down, "must be >= 1")


@register_policy("slo-capacity", config=SloCapacityConfig)
class SloCapacityPolicy(ScalingPolicy):
    """Replicas for the work arriving at its lengths, the queue held to the TTFT SLO; slow to let go."""

    config: SloCapacityConfig

    def __post_init__(self) -> None:
        super().__post_init__()
        self._needs: list[tuple[float, int]] = []  # (now_s, need) of past decisions

    def reset(self) -> None:
        self._needs.clear()

    def recommend(self, history: Sequence[ScalingSignals], fleet: FleetState) -> Recommendation:
        cfg, now = self.config, fleet.now_s
        rate = window_mean(history, "arrival_rate_rps", now, cfg.interval_s)
        if rate is None:
            return Recommendation(fleet.current, Reason.NO_SIGNAL, "no arrival rate in the last interval")
        mu = cfg.target_utilization * self._capacity(history, now)
        cold_s = fleet.cold_start_s if fleet.cold_start_s is not None else cfg.cold_start_s
        waiting = history[-1].waiting
        need = math.ceil((rate + waiting / (cold_s + cfg.ttft_slo_s)) / mu - 1e-9)
        self._needs = [(t, n) for t, n in self._needs if now - t < cfg.hold_s] + [(now, need)]
        held = max(n for _, n in self._needs)
        detail = (f"rate {rate:.2f}/s, {waiting:.0f} waiting, {mu:.2f}/s per replica: need {need}, "
                  f"{held} over the last {cfg.hold_s:g} s")
        if held >= fleet.current:
            return Recommendation(held, compare(held, fleet.current), detail)
        if fleet.starting:
            return Recommendation(fleet.current, Reason.STARTING_HOLD, f"{detail}; replicas are loading")
        return Recommendation(max(held, fleet.current - cfg.max_scale_down), Reason.SCALE_DOWN, detail)

    def _capacity(self, history: Sequence[ScalingSignals], now_s: float) -> float:
        """The latest full-batch rate the driver reported in the interval, else the configured one."""
        for sample in reversed(window(history, now_s, self.config.interval_s)):
            if sample.replica_capacity_rps:
                return sample.replica_capacity_rps
        return self.config.capacity_rps

    def choose_drain(self, fleet: FleetState, count: int) -> list[str]:
        """Cheapest ready replicas to lose; a starting replica is never chosen."""
        ready = sorted(fleet.in_state(ReplicaState.READY), key=lambda r: (
            r.in_flight, r.unique_cached_prefixes + r.pinned_sessions, -r.started_at_s, r.replica_id))
        return [r.replica_id for r in ready[:count]]
