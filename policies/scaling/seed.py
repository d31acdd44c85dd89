"""`seed`: the rule of the seed lesson's Example 18.

Every `interval_s`:

    desired = ceil((observed rate + waiting / drain_s) / (target_utilization x capacity_rps))

where the observed rate is the mean arrival rate over the last interval and waiting is the
latest queue (vLLM waiting, else llama.cpp deferred). Starting replicas count towards the fleet,
but the rule knows nothing of cold starts: it keeps asking for replicas for a queue that replicas
already on their way would drain. Like the lesson's scaler it only adds replicas unless
`scale_down` is set.
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
    ScalingPolicy,
    ScalingSignals,
    compare,
    window_mean,
)
from policies.scaling.registry import register_policy


@dataclass(frozen=True)
class SeedConfig:
    capacity_rps: float = 2.0
    """Requests per second one replica serves."""
    target_utilization: float = 0.8
    """Share of a replica's capacity to plan for, in (0, 1]."""
    drain_s: float = 60.0
    """Seconds in which the waiting requests should be worked off."""
    interval_s: float = 30.0
    """Seconds between decisions; the arrival rate is averaged over this window."""
    scale_down: bool = False
    """Also remove replicas when the rule asks for fewer (Example 18's scaler never does)."""

    def __post_init__(self) -> None:
        check_rate_model(self.capacity_rps, self.target_utilization, self.drain_s, self.interval_s)


def check_rate_model(capacity_rps: float, target_utilization: float, drain_s: float, interval_s: float) -> None:
    """Validation shared by the policies that plan from a per-replica request rate."""
    if capacity_rps <= 0:
        raise ConfigError("capacity_rps", capacity_rps, "must be > 0")
    if not 0 < target_utilization <= 1:
        raise ConfigError("target_utilization", target_utilization, "must be in (0, 1]")
    if drain_s <= 0:
        raise ConfigError("drain_s", drain_s, "must be > 0")
    if interval_s <= 0:
        raise ConfigError("interval_s", interval_s, "must be > 0")


@register_policy("seed", config=SeedConfig)
class SeedPolicy(ScalingPolicy):
    """Example 18: ceil((rate + waiting / drain time) / (target utilisation x capacity))."""

    config: SeedConfig

    def recommend(self, history: Sequence[ScalingSignals], fleet: FleetState) -> Recommendation:
        cfg = self.config
        observed = window_mean(history, "arrival_rate_rps", fleet.now_s, cfg.interval_s)
        if observed is None:
            return Recommendation(fleet.current, Reason.NO_SIGNAL, "no arrival rate in the last interval")
        waiting = history[-1].waiting
        desired = math.ceil((observed + waiting / cfg.drain_s) / (cfg.target_utilization * cfg.capacity_rps))
        detail = (f"ceil(({observed:.2f}/s + {waiting:.0f} waiting / {cfg.drain_s:g} s)"
                  f" / {cfg.target_utilization * cfg.capacity_rps:g}/s) = {desired}")
        if desired < fleet.current and not cfg.scale_down:
            return Recommendation(fleet.current, Reason.STEADY, f"{detail}; scale-down is off")
        return Recommendation(desired, compare(desired, fleet.current), detail)
