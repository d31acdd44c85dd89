"""`target-tracking`: Kubernetes' HorizontalPodAutoscaler rule on one signal.

Every `interval_s` (HPA's sync period, 15 s):

    ratio = per-replica metric / target
    raw = current                         if |ratio - 1| <= tolerance
          ceil(ready x ratio)             otherwise

The per-replica metric is the latest sample's value divided by the ready replicas for fleet
totals (waiting, running, deferred, processing, arrival rate, concurrency) and taken as is for
signals that are already averages (KV-cache usage, TTFT percentiles). Recommendations are then
stabilised as HPA's `behavior` does: scale up to the lowest recommendation of the last
`up_window_s` (0 s: at once) and down only to the highest of the last `down_window_s` (300 s).
With no ready replica the rule holds (HPA cannot measure a fleet of zero), but asks for at least
one replica while the metric is above zero (requests held by the proxy count as waiting).
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
    demand_floor,
    per_replica,
    require_non_negative,
    signal_value,
    validate_signal_name,
)
from policies.scaling.registry import register_policy


@dataclass(frozen=True)
class TargetTrackingConfig:
    metric: str = "num_requests_waiting"
    """Signal to track (a ScalingSignals field, or concurrency/waiting/running)."""
    target: float = 5.0
    """Wanted value of the metric per replica (production-stack's KEDA threshold on waiting is 5)."""
    tolerance: float = 0.1
    """No change while the ratio of metric to target is within 1 +- tolerance."""
    up_window_s: float = 0.0
    """Scale-up stabilisation window: act on the lowest recommendation within it (seconds)."""
    down_window_s: float = 300.0
    """Scale-down stabilisation window: act on the highest recommendation within it (seconds)."""
    interval_s: float = 15.0
    """Seconds between decisions (HPA's --horizontal-pod-autoscaler-sync-period)."""

    def __post_init__(self) -> None:
        validate_signal_name("metric", self.metric)
        if self.target <= 0:
            raise ConfigError("target", self.target, "must be > 0")
        if not 0 <= self.tolerance < 1:
            raise ConfigError("tolerance", self.tolerance, "must be in [0, 1)")
        require_non_negative(self, "up_window_s", "down_window_s")
        if self.interval_s <= 0:
            raise ConfigError("interval_s", self.interval_s, "must be > 0")


@register_policy("target-tracking", config=TargetTrackingConfig)
class TargetTrackingPolicy(ScalingPolicy):
    """Kubernetes HPA: ceil(ready x metric / target), tolerance band, stabilisation windows."""

    config: TargetTrackingConfig

    def __post_init__(self) -> None:
        super().__post_init__()
        self._recommendations: list[tuple[float, int]] = []  # (now_s, raw recommendation)

    def recommend(self, history: Sequence[ScalingSignals], fleet: FleetState) -> Recommendation:
        raw = self.raw_recommendation(history, fleet)
        if raw.reason is Reason.NO_SIGNAL:
            return raw
        self._remember(fleet.now_s, raw.desired)
        stable = self._stabilised(fleet.current, fleet.now_s)
        if stable != raw.desired and raw.reason is not Reason.TOLERANCE:
            return Recommendation(stable, Reason.STABILIZED, f"{raw.detail}; stabilised to {stable}")
        return Recommendation(stable, raw.reason, raw.detail)

    def raw_recommendation(self, history: Sequence[ScalingSignals], fleet: FleetState) -> Recommendation:
        """HPA's rule on the latest sample, before stabilisation."""
        cfg = self.config
        value = signal_value(history[-1], cfg.metric) if history else None
        if value is None:
            return Recommendation(fleet.current, Reason.NO_SIGNAL, f"no {cfg.metric} sample")
        if fleet.ready == 0:
            desired = demand_floor(fleet.current, value)
            return Recommendation(desired, Reason.NO_SIGNAL, f"no ready replica to measure; {cfg.metric} {value:g}")
        each = per_replica(cfg.metric, value, fleet.ready)
        ratio = each / cfg.target
        detail = f"{cfg.metric} {each:.3g} per replica / target {cfg.target:g} = {ratio:.3f}"
        if abs(ratio - 1) <= cfg.tolerance:
            return Recommendation(fleet.current, Reason.TOLERANCE, f"{detail}; within tolerance")
        desired = math.ceil(fleet.ready * ratio)
        return Recommendation(desired, compare(desired, fleet.current), f"{detail}: ceil({fleet.ready} x ratio) = {desired}")

    def _remember(self, now_s: float, desired: int) -> None:
        horizon = max(self.config.up_window_s, self.config.down_window_s)
        self._recommendations = [(t, d) for t, d in self._recommendations if now_s - t < horizon]
        self._recommendations.append((now_s, desired))

    def _stabilised(self, current: int, now_s: float) -> int:
        up = min(d for t, d in self._recommendations if _within(t, now_s, self.config.up_window_s))
        down = max(d for t, d in self._recommendations if _within(t, now_s, self.config.down_window_s))
        if current < up:
            return up
        return down if current > down else current

    def reset(self) -> None:
        self._recommendations = []


def _within(t: float, now_s: float, window_s: float) -> bool:
    """HPA keeps recommendations newer than now - window, and always the current one."""
    return t == now_s or now_s - t < window_s
