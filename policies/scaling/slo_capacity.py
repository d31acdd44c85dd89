"""`slo-capacity`: size the fleet from the work arriving at its lengths, with the headroom a burst
needs, and give capacity back once it has gone unused for a while, cheapest replica first.

Every `interval_s`:

1. Each sample's load is its arrival rate over one replica's full-batch rate at the mean prompt
   and output lengths that arrived in it (the capacity model's `replica_capacity_rps` signal;
   the last one reported, else `capacity_rps`): replicas kept fully busy. A 2,000-token prompt
   costs four times a 500-token one: the count follows the work, not the request count.
2. need = max(ceil(mean load over a cold start / target_utilization),
   ceil(latest load / burst_utilization)) + the backlog that new replicas, arriving one cold
   start from now, must clear within the TTFT SLO. The mean over a cold start is the load a
   replica launched now can still serve; the latest sample's load is the burst the fleet in
   place must absorb (a burst shorter than a cold start is over before a new replica is ready).
3. The count is the largest need of the last `hold_s`: bursty traffic comes back, and a replica
   given back between bursts costs a cold start to get again. It falls by at most
   `max_scale_down` replicas per decision, never while a replica is loading.
4. To shrink it drains the ready replicas whose loss costs least: fewest in-flight requests, then
   fewest unique cached prefixes plus pinned sessions (warm prefix caches stay), then the newest.
"""

from __future__ import annotations

import dataclasses
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
    require_non_negative,
    require_positive,
    window,
)
from policies.scaling.registry import register_policy


@dataclass(frozen=True)
class SloCapacityConfig:
    target_utilization: float = 0.3
    """Share of the capacity model's full-batch rate one replica may carry, averaged over a cold
    start, and still meet the latency SLOs, in (0, 1]: full batches meet no TPOT SLO."""
    burst_utilization: float = 0.5
    """Share of the full-batch rate one replica may carry over one interval (a burst)."""
    capacity_rps: float = 2.0
    """Full-batch requests per second of one replica until a driver reports `replica_capacity_rps`."""
    ttft_slo_s: float = 1.0
    """The TTFT SLO the queue is held to (seconds)."""
    cold_start_s: float = 60.0
    """Cold start assumed until the fleet has measured one (seconds)."""
    hold_s: float = 400.0
    """Seconds a need is remembered: the fleet shrinks only below every need of this window."""
    max_scale_down: int = 1
    """Most replicas one decision removes."""
    scale_down_cooldown_s: float = 120.0
    """The shared scale-down cooldown, 0 here by default: `hold_s` already protects a fleet
    sized for a burst, and a cooldown counted from every scale-up would stop it giving back."""
    interval_s: float = 5.0
    """Seconds between decisions; one sample's load is the burst load."""

    def __post_init__(self) -> None:
        for name in ("target_utilization", "burst_utilization"):
            if not 0 < getattr(self, name) <= 1:
                raise ConfigError(name, getattr(self, name), "must be in (0, 1]")
        require_positive(self, "capacity_rps", "ttft_slo_s", "interval_s")
        require_non_negative(self, "cold_start_s", "hold_s", "scale_down_cooldown_s")
        if self.max_scale_down < 1:
            raise ConfigError("max_scale_down", self.max_scale_down, "must be >= 1")


@register_policy("slo-capacity", config=SloCapacityConfig)
class SloCapacityPolicy(ScalingPolicy):
    """Replicas for the work arriving at its lengths plus burst headroom; given back after hold_s."""

    config: SloCapacityConfig

    def __post_init__(self) -> None:
        super().__post_init__()
        # the config's cooldown is the one the shared limits apply (see its docstring)
        self.limits = dataclasses.replace(self.limits, scale_down_cooldown_s=self.config.scale_down_cooldown_s)
        self._needs: list[tuple[float, int]] = []  # (now_s, need) of past decisions

    def reset(self) -> None:
        self._needs.clear()

    def recommend(self, history: Sequence[ScalingSignals], fleet: FleetState) -> Recommendation:
        cfg, now = self.config, fleet.now_s
        cold_s = fleet.cold_start_s if fleet.cold_start_s is not None else cfg.cold_start_s
        loads = self._loads(history, now, max(cold_s, cfg.interval_s))
        if not loads:
            return Recommendation(fleet.current, Reason.NO_SIGNAL, "no arrival rate in the last cold start")
        mean_load, burst_load = sum(loads) / len(loads), loads[-1]
        waiting = history[-1].waiting
        backlog = waiting / (cold_s + cfg.ttft_slo_s) / self._capacity(history)
        need = max(_ceil(mean_load / cfg.target_utilization), _ceil(burst_load / cfg.burst_utilization))
        need = max(need, _ceil((mean_load + backlog) / cfg.target_utilization))
        self._needs = [(t, n) for t, n in self._needs if now - t < cfg.hold_s] + [(now, need)]
        held = max(n for _, n in self._needs)
        detail = (f"load {mean_load:.2f} over {cold_s:g} s, burst {burst_load:.2f}, {waiting:.0f} waiting "
                  f"(replicas at full batch): need {need}, {held} over the last {cfg.hold_s:g} s")
        if held >= fleet.current:
            return Recommendation(held, compare(held, fleet.current), detail)
        if fleet.starting:
            return Recommendation(fleet.current, Reason.STARTING_HOLD, f"{detail}; replicas are loading")
        return Recommendation(max(held, fleet.current - cfg.max_scale_down), Reason.SCALE_DOWN, detail)

    def _loads(self, history: Sequence[ScalingSignals], now_s: float, window_s: float) -> list[float]:
        """Each sample's arrival rate in full-batch replicas, oldest first, over the window."""
        loads, capacity = [], self.config.capacity_rps
        earlier = [s.replica_capacity_rps for s in history if s.at_s <= now_s - window_s and s.replica_capacity_rps]
        capacity = earlier[-1] if earlier else capacity
        for sample in window(history, now_s, window_s):
            capacity = sample.replica_capacity_rps or capacity
            if sample.arrival_rate_rps is not None:
                loads.append(sample.arrival_rate_rps / capacity)
        return loads

    def _capacity(self, history: Sequence[ScalingSignals]) -> float:
        """The latest full-batch rate a driver reported, else the configured one."""
        for sample in reversed(history):
            if sample.replica_capacity_rps:
                return sample.replica_capacity_rps
        return self.config.capacity_rps

    def choose_drain(self, fleet: FleetState, count: int) -> list[str]:
        """Cheapest ready replicas to lose; a starting replica is never chosen."""
        ready = sorted(fleet.in_state(ReplicaState.READY), key=lambda r: (
            r.in_flight, r.unique_cached_prefixes + r.pinned_sessions, -r.started_at_s, r.replica_id))
        return [r.replica_id for r in ready[:count]]


def _ceil(replicas: float) -> int:
    return math.ceil(replicas - 1e-9)
