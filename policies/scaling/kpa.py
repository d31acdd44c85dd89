"""`kpa`: Knative's Pod Autoscaler, stable and panic windows on requests in the system.

Every `interval_s` (Knative's 2 s tick), with R = max(1, ready replicas):

    stable = ceil(mean of metric over stable_window_s / target)
    panic  = ceil(mean of metric over panic_window_s / target)

both bounded to [floor(R / max_scale_down_rate), ceil(max_scale_up_rate x R)]. Panic starts when
panic / R >= panic_threshold and is extended every tick it still holds; it ends once a whole
stable window has passed since the threshold last held. While panicking the count is the larger
of the two and never goes down (the highest count of the panic). Outside panic it is `stable`.
A fall to zero waits until the rule has asked for zero for `scale_to_zero_grace_s`; before that
one replica stays (give `min_replicas=0` to let it go at all).
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
    require_positive,
    validate_signal_name,
    window_mean,
)
from policies.scaling.registry import register_policy


@dataclass(frozen=True)
class KpaConfig:
    metric: str = "concurrency"
    """Signal summed over the fleet; concurrency is running plus waiting requests."""
    target: float = 10.0
    """Wanted value of the metric per replica (requests in the system per replica)."""
    stable_window_s: float = 60.0
    """Averaging window of the stable rule, and the least time panic mode lasts (seconds)."""
    panic_window_s: float = 6.0
    """Averaging window of the panic rule (seconds; Knative: 10% of the stable window)."""
    panic_threshold: float = 2.0
    """Panic when the panic count is at least this many times the ready replicas."""
    max_scale_up_rate: float = 1000.0
    """At most ceil(rate x ready) replicas after one decision."""
    max_scale_down_rate: float = 2.0
    """At least floor(ready / rate) replicas after one decision."""
    scale_to_zero_grace_s: float = 30.0
    """How long the rule must ask for zero before the last replica goes (seconds)."""
    interval_s: float = 2.0
    """Seconds between decisions (Knative's tick)."""

    def __post_init__(self) -> None:
        validate_signal_name("metric", self.metric)
        require_positive(self, "target", "stable_window_s", "panic_window_s", "interval_s")
        if self.panic_window_s > self.stable_window_s:
            raise ConfigError("panic_window_s", self.panic_window_s, "must be <= stable_window_s")
        for name in ("panic_threshold", "max_scale_up_rate", "max_scale_down_rate"):
            if getattr(self, name) < 1:
                raise ConfigError(name, getattr(self, name), "must be >= 1")
        if self.scale_to_zero_grace_s < 0:
            raise ConfigError("scale_to_zero_grace_s", self.scale_to_zero_grace_s, "must be >= 0")


@register_policy("kpa", config=KpaConfig)
class KpaPolicy(ScalingPolicy):
    """Knative KPA: 60 s stable and 6 s panic windows, panic at 2x, no scale-down in panic."""

    config: KpaConfig

    def __post_init__(self) -> None:
        super().__post_init__()
        self.reset()

    def reset(self) -> None:
        self.panic_time_s: float | None = None  # last tick the panic threshold held; None: calm
        self.max_panic_pods = 0  # highest count asked for during this panic
        self.zero_since_s: float | None = None  # first tick of the current run of zero counts

    @property
    def panicking(self) -> bool:
        return self.panic_time_s is not None

    def recommend(self, history: Sequence[ScalingSignals], fleet: FleetState) -> Recommendation:
        cfg = self.config
        stable_value = window_mean(history, cfg.metric, fleet.now_s, cfg.stable_window_s)
        panic_value = window_mean(history, cfg.metric, fleet.now_s, cfg.panic_window_s)
        if stable_value is None or panic_value is None:
            return Recommendation(fleet.current, Reason.NO_SIGNAL, f"no {cfg.metric} in the windows")
        ready = max(1, fleet.ready)
        stable, panic = (self._bounded(math.ceil(v / cfg.target), ready) for v in (stable_value, panic_value))
        self._update_panic(panic / ready >= cfg.panic_threshold, fleet.now_s)
        detail = f"stable {stable_value:.3g} -> {stable}, panic {panic_value:.3g} -> {panic}, ready {fleet.ready}"
        if self.panicking:
            self.max_panic_pods = max(self.max_panic_pods, stable, panic)
            return Recommendation(self.max_panic_pods, Reason.PANIC, f"{detail}; panicking")
        return self._grace_for_zero(Recommendation(stable, compare(stable, fleet.current), detail), fleet)

    def _bounded(self, desired: int, ready: int) -> int:
        low = math.floor(ready / self.config.max_scale_down_rate)
        high = math.ceil(self.config.max_scale_up_rate * ready)
        return min(max(desired, low), high)

    def _update_panic(self, over_threshold: bool, now_s: float) -> None:
        if over_threshold:
            self.panic_time_s = now_s
        elif self.panic_time_s is not None and self.panic_time_s + self.config.stable_window_s < now_s:
            self.panic_time_s = None
            self.max_panic_pods = 0

    def _grace_for_zero(self, rec: Recommendation, fleet: FleetState) -> Recommendation:
        now_s = fleet.now_s
        if rec.desired > 0:
            self.zero_since_s = None
            return rec
        if fleet.current == 0:  # already at zero: the grace only guards the last replica
            return rec
        if self.zero_since_s is None:
            self.zero_since_s = now_s
        if now_s - self.zero_since_s < self.config.scale_to_zero_grace_s:
            return Recommendation(1, Reason.SCALE_TO_ZERO_GRACE, f"{rec.detail}; idle for"
                                  f" {now_s - self.zero_since_s:g} s of {self.config.scale_to_zero_grace_s:g} s")
        return rec
