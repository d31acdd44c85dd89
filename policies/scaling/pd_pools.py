"""`pd-prefill` and `pd-decode`: each pool of a disaggregated fleet scaled on its own signals.

Prefill is compute-bound: its pressure shows as queued prompts and as time to first token.
Decode is memory-bound: its pressure shows as KV-cache usage and as time per output token.
(Dynamo's planner sizes its two pools on the same pairs.) One rule serves both, on a load
signal and a latency signal:

    ratio = max(load per replica / load_target, latency / latency_slo_s)
    ratio > 1                      -> ceil(ready x min(ratio, max_up_factor))
    ratio < scale_down_below       -> ready - 1 (one at a time; the cooldown applies)
    otherwise                      -> hold

Fleet totals (waiting, running) are divided by the ready replicas; averages (KV usage,
latency percentiles) are taken as they are. An absent signal is left out; with neither, hold.
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
    demand_floor,
    per_replica,
    require_positive,
    signal_value,
    validate_signal_name,
)
from policies.scaling.registry import register_policy


@dataclass(frozen=True)
class PoolConfig:
    load_metric: str = "waiting"
    """Load signal (a ScalingSignals field, or waiting/running/concurrency)."""
    load_target: float = 2.0
    """Wanted load per replica."""
    latency_metric: str = "ttft_p90_s"
    """Latency signal: ttft_p50_s/ttft_p90_s/ttft_p99_s, tpot_p90_s."""
    latency_slo_s: float = 2.0
    """The pool's latency objective (seconds)."""
    scale_down_below: float = 0.4
    """Both ratios under this: one replica fewer."""
    max_up_factor: float = 2.0
    """Most a decision multiplies the ready replicas by (a queue's latency overstates the need)."""
    interval_s: float = 15.0
    """Seconds between decisions."""

    def __post_init__(self) -> None:
        validate_signal_name("load_metric", self.load_metric)
        validate_signal_name("latency_metric", self.latency_metric)
        require_positive(self, "load_target", "latency_slo_s", "interval_s")
        if not 0 <= self.scale_down_below < 1:
            raise ConfigError("scale_down_below", self.scale_down_below, "must be in [0, 1)")
        if self.max_up_factor <= 1:
            raise ConfigError("max_up_factor", self.max_up_factor, "must be > 1")


@dataclass(frozen=True)
class PrefillPoolConfig(PoolConfig):
    """Prefill: queued prompts per replica and TTFT p90."""


@dataclass(frozen=True)
class DecodePoolConfig(PoolConfig):
    """Decode: KV-cache usage and TPOT p90."""

    load_metric: str = "kv_cache_usage"
    load_target: float = 0.8
    latency_metric: str = "tpot_p90_s"
    latency_slo_s: float = 0.1


class PoolPolicy(ScalingPolicy):
    """The rule above on one pool's load and latency."""

    config: PoolConfig

    def recommend(self, history: Sequence[ScalingSignals], fleet: FleetState) -> Recommendation:
        cfg = self.config
        sample = history[-1] if history else None
        load = signal_value(sample, cfg.load_metric) if sample else None
        latency = signal_value(sample, cfg.latency_metric) if sample else None
        if fleet.ready == 0:
            return Recommendation(demand_floor(fleet.current, load), Reason.NO_SIGNAL, "no ready replica to measure")
        ratios = {}
        if load is not None:
            ratios[cfg.load_metric] = per_replica(cfg.load_metric, load, fleet.ready) / cfg.load_target
        if latency is not None:
            ratios[cfg.latency_metric] = latency / cfg.latency_slo_s
        if not ratios:
            return Recommendation(fleet.current, Reason.NO_SIGNAL, f"no {cfg.load_metric} or {cfg.latency_metric}")
        worst = max(ratios, key=lambda name: ratios[name])
        ratio = ratios[worst]
        detail = ", ".join(f"{name} ratio {value:.2f}" for name, value in ratios.items())
        if ratio > 1:
            desired = max(fleet.current, math.ceil(fleet.ready * min(ratio, cfg.max_up_factor)))
            return Recommendation(desired, Reason.SCALE_UP if desired > fleet.current else Reason.STEADY,
                                  f"{detail}: {worst} over target, {desired}")
        if ratio < cfg.scale_down_below and fleet.starting == 0:
            return Recommendation(fleet.ready - 1, Reason.SCALE_DOWN, f"{detail}: under {cfg.scale_down_below:g}")
        return Recommendation(fleet.current, Reason.TOLERANCE, f"{detail}: hold")


@register_policy("pd-prefill", config=PrefillPoolConfig)
class PrefillPoolPolicy(PoolPolicy):
    """A P/D fleet's prefill pool: waiting prompts per replica and TTFT p90."""


@register_policy("pd-decode", config=DecodePoolConfig)
class DecodePoolPolicy(PoolPolicy):
    """A P/D fleet's decode pool: KV-cache usage and TPOT p90."""
