"""What every scaling policy sees and returns.

A scaling policy is pure: it gets the signal history and the fleet as it stands at `now_s`
and returns how many replicas the fleet should have, why, and which replicas to drain. It never
reads the clock, sleeps or does I/O; `now_s` comes in with the fleet. Policies may remember
their own past recommendations (stabilisation windows, panic mode), keyed by the `now_s` they
were given, so the same object runs live, time-scaled and in the fluid what-if.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import ClassVar

from flotilla.errors import ConfigError as ConfigError  # re-exported: the policies' error


@dataclass(frozen=True)
class ScalingSignals:
    """One timestamped sample of the fleet's load. Counts are fleet totals over ready replicas;
    every field but `at_s` may be absent when no source reports it."""

    at_s: float
    """When the sample was taken, seconds on the autoscaler's clock."""
    arrival_rate_rps: float | None = None
    """Requests arriving per second at the proxy since the previous sample."""
    num_requests_waiting: float | None = None
    """vLLM `vllm:num_requests_waiting`, summed over replicas (requests)."""
    num_requests_running: float | None = None
    """vLLM `vllm:num_requests_running`, summed over replicas (requests)."""
    kv_cache_usage: float | None = None
    """vLLM `vllm:kv_cache_usage_perc`, mean over replicas, in [0, 1]."""
    requests_deferred: float | None = None
    """llama.cpp `llamacpp:requests_deferred`, summed over replicas (requests)."""
    requests_processing: float | None = None
    """llama.cpp `llamacpp:requests_processing`, summed over replicas (requests)."""
    ttft_p50_s: float | None = None
    """Median time to first token over the sample's window (seconds)."""
    ttft_p90_s: float | None = None
    """90th percentile time to first token (seconds)."""
    ttft_p99_s: float | None = None
    """99th percentile time to first token (seconds)."""
    tpot_p90_s: float | None = None
    """90th percentile time per output token over the sample's window (seconds): a decode
    pool's latency signal (P/D fleets, `pd-decode`)."""
    replica_capacity_rps: float | None = None
    """Requests per second one replica completes when full, at the mean prompt and output lengths
    of the requests that arrived since the previous sample: the capacity model's figure
    (`fake_engines.capacity`), which the driver knows from the engines' command lines."""

    @property
    def waiting(self) -> float:
        """Queued requests whichever engine reports them (vLLM waiting, else llama.cpp deferred)."""
        for value in (self.num_requests_waiting, self.requests_deferred):
            if value is not None:
                return value
        return 0.0

    @property
    def running(self) -> float:
        """Requests being served whichever engine reports them."""
        for value in (self.num_requests_running, self.requests_processing):
            if value is not None:
                return value
        return 0.0


# Signals already averaged over replicas; every other signal is a fleet total.
AVERAGED_SIGNALS = frozenset({"kv_cache_usage", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "tpot_p90_s"})
# `concurrency` is Knative's metric: requests in the system (running plus waiting).
DERIVED_SIGNALS = frozenset({"concurrency", "waiting", "running"})
SIGNAL_NAMES = frozenset(f.name for f in fields(ScalingSignals) if f.name != "at_s") | DERIVED_SIGNALS


def signal_value(sample: ScalingSignals, name: str) -> float | None:
    """The value of signal `name` (a field of ScalingSignals or a derived signal) in `sample`."""
    if name == "concurrency":
        return sample.waiting + sample.running
    value: float | None = getattr(sample, name)
    return value


def per_replica(name: str, value: float, ready: int) -> float:
    """Signal `name`'s value per ready replica: a fleet total divided by `ready` (> 0), an average as it is."""
    return value if name in AVERAGED_SIGNALS else value / ready


def demand_floor(current: int, value: float | None) -> int:
    """The count to ask for when no replica is ready to measure: a fleet of zero cannot be measured,
    so demand alone (a signal above zero, e.g. requests the proxy holds) brings one replica."""
    return max(1, current) if (value or 0) > 0 else current


def window(history: Sequence[ScalingSignals], now_s: float, window_s: float) -> list[ScalingSignals]:
    """Samples taken in (now_s - window_s, now_s]."""
    return [s for s in history if now_s - window_s < s.at_s <= now_s]


def window_mean(history: Sequence[ScalingSignals], name: str, now_s: float, window_s: float) -> float | None:
    """Mean of signal `name` over the window, skipping absent values; None when none is present."""
    values = [v for s in window(history, now_s, window_s) if (v := signal_value(s, name)) is not None]
    return sum(values) / len(values) if values else None


def require_positive(config: object, *names: str) -> None:
    """ConfigError naming the first of the fields `names` of `config` that is not above 0."""
    for name in names:
        if getattr(config, name) <= 0:
            raise ConfigError(name, getattr(config, name), "must be > 0")


def require_non_negative(config: object, *names: str) -> None:
    """ConfigError naming the first of the fields `names` of `config` that is below 0."""
    for name in names:
        if getattr(config, name) < 0:
            raise ConfigError(name, getattr(config, name), "must be >= 0")


def validate_signal_name(field_name: str, value: str) -> None:
    if value not in SIGNAL_NAMES:
        raise ConfigError(field_name, value, f"must be one of {', '.join(sorted(SIGNAL_NAMES))}")


class ReplicaState(enum.Enum):
    STARTING = "starting"  # launched, loading weights or warming up: capacity in progress
    READY = "ready"  # serving
    DRAINING = "draining"  # finishing in-flight requests before it stops: no longer counted


@dataclass(frozen=True)
class ReplicaInfo:
    """One replica as a scaling policy sees it."""

    replica_id: str
    state: ReplicaState
    started_at_s: float
    """When the replica was launched (seconds on the autoscaler's clock)."""
    ready_at_s: float | None = None
    """When it became ready; None while starting."""
    in_flight: int = 0
    """Requests the proxy has outstanding on it."""
    unique_cached_prefixes: int = 0
    """Prompt prefixes cached on this replica and on no other (lost if it goes)."""
    pinned_sessions: int = 0
    """Sessions whose affinity points at this replica."""


@dataclass(frozen=True)
class FleetState:
    """The fleet at decision time."""

    now_s: float
    """Decision time, seconds on the autoscaler's clock; the only clock a policy sees."""
    replicas: tuple[ReplicaInfo, ...] = ()
    cold_start_s: float | None = None
    """Measured cold start (launch to ready, seconds); None before any replica became ready."""
    last_scaled_at_s: float | None = None
    """When the replica count last changed, up or down; None if never."""

    def in_state(self, state: ReplicaState) -> list[ReplicaInfo]:
        return [r for r in self.replicas if r.state is state]

    @property
    def ready(self) -> int:
        return len(self.in_state(ReplicaState.READY))

    @property
    def starting(self) -> int:
        return len(self.in_state(ReplicaState.STARTING))

    @property
    def draining(self) -> int:
        return len(self.in_state(ReplicaState.DRAINING))

    @property
    def current(self) -> int:
        """Replicas the fleet counts as its size: ready plus starting (draining ones are leaving)."""
        return self.ready + self.starting


def measured_cold_start_s(replicas: Sequence[ReplicaInfo]) -> float | None:
    """Mean launch-to-ready time of the replicas that became ready; None when none has."""
    spans = [r.ready_at_s - r.started_at_s for r in replicas if r.ready_at_s is not None]
    return sum(spans) / len(spans) if spans else None


class Reason(enum.Enum):
    """Why a decision came out as it did: a short, bounded label for metrics."""

    SCALE_UP = "scale-up"  # the policy's rule asks for more replicas
    SCALE_DOWN = "scale-down"  # the policy's rule asks for fewer replicas
    STEADY = "steady"  # the rule's count equals the current count
    NO_SIGNAL = "no-signal"  # the signals the rule needs are absent: hold
    TOLERANCE = "tolerance"  # within the tolerance band around the target: hold
    STABILIZED = "stabilized"  # a stabilisation window held back the change
    PANIC = "panic"  # KPA panic mode: scale on the short window, never down
    SCALE_TO_ZERO_GRACE = "scale-to-zero-grace"  # idle, but the grace period has not passed
    STARTING_HOLD = "starting-hold"  # replicas are still loading: no scale-down
    MIN_REPLICAS = "min-replicas"  # raised to the floor
    MAX_REPLICAS = "max-replicas"  # lowered to the ceiling
    MAX_STEP = "max-step"  # scale-up cut to the maximum step
    COOLDOWN = "cooldown"  # scale-down waits for the cooldown after the last change


@dataclass(frozen=True)
class Recommendation:
    """A policy rule's answer before the shared limits apply."""

    desired: int
    """Replicas the rule wants (ready plus starting)."""
    reason: Reason
    detail: str = ""
    """Human explanation with the figures used."""


@dataclass(frozen=True)
class ScalingDecision:
    """What the autoscaler should do now."""

    desired: int
    """Replicas the fleet should count (ready plus starting) after this decision."""
    reason: Reason
    detail: str = ""
    """Human explanation with the figures used."""
    drain: tuple[str, ...] = ()
    """Replica ids to drain, exactly current - desired of them when scaling down."""

    @property
    def reason_label(self) -> str:
        return self.reason.value


@dataclass(frozen=True)
class ScalingLimits:
    """Bounds every policy honours, applied after the policy's own rule."""

    min_replicas: int = 1
    """Floor on the fleet size; 0 allows scale to zero."""
    max_replicas: int = 100
    """Ceiling on the fleet size."""
    max_scale_up_step: int | None = None
    """Most replicas added by one decision; None for no limit."""
    scale_down_cooldown_s: float = 300.0
    """Seconds after the last change of the replica count before a scale-down may happen."""

    def __post_init__(self) -> None:
        if self.min_replicas < 0:
            raise ConfigError("min_replicas", self.min_replicas, "must be >= 0")
        if self.max_replicas < max(1, self.min_replicas):
            raise ConfigError("max_replicas", self.max_replicas, "must be >= 1 and >= min_replicas")
        if self.max_scale_up_step is not None and self.max_scale_up_step < 1:
            raise ConfigError("max_scale_up_step", self.max_scale_up_step, "must be >= 1 or none")
        if self.scale_down_cooldown_s < 0:
            raise ConfigError("scale_down_cooldown_s", self.scale_down_cooldown_s, "must be >= 0")


def apply_limits(rec: Recommendation, fleet: FleetState, limits: ScalingLimits) -> Recommendation:
    """Bound a recommendation by min/max replicas, the scale-up step and the scale-down cooldown."""
    current = fleet.current
    rec = _clamp(rec, limits)
    if limits.max_scale_up_step is not None and rec.desired > current + limits.max_scale_up_step:
        step = limits.max_scale_up_step
        return Recommendation(current + step, Reason.MAX_STEP, f"{rec.detail}; step capped at +{step}")
    if rec.desired < current and _cooling_down(fleet, limits):
        if current > limits.max_replicas:  # the ceiling does not wait for the cooldown
            return Recommendation(limits.max_replicas, Reason.MAX_REPLICAS, f"{rec.detail}; down to max_replicas")
        return Recommendation(current, Reason.COOLDOWN, f"{rec.detail}; scale-down waits for the cooldown")
    return rec


def _clamp(rec: Recommendation, limits: ScalingLimits) -> Recommendation:
    if rec.desired > limits.max_replicas:
        return Recommendation(limits.max_replicas, Reason.MAX_REPLICAS, f"{rec.detail}; capped at max_replicas")
    if rec.desired < limits.min_replicas:
        return Recommendation(limits.min_replicas, Reason.MIN_REPLICAS, f"{rec.detail}; raised to min_replicas")
    return rec


def _cooling_down(fleet: FleetState, limits: ScalingLimits) -> bool:
    last = fleet.last_scaled_at_s
    return last is not None and fleet.now_s - last < limits.scale_down_cooldown_s


@dataclass
class ScalingPolicy(abc.ABC):
    """Base class: subclasses set `name` and `Config` and implement `recommend`."""

    config: object | None = None
    limits: ScalingLimits = field(default_factory=ScalingLimits)

    name: ClassVar[str] = ""
    Config: ClassVar[type | None] = None

    def __post_init__(self) -> None:
        if self.config is None and self.Config is not None:
            self.config = self.Config()

    @property
    def interval_s(self) -> float:
        """How often the driver should ask for a decision (seconds)."""
        return float(getattr(self.config, "interval_s", 15.0))

    def decide(self, history: Sequence[ScalingSignals], fleet: FleetState) -> ScalingDecision:
        """The decision at `fleet.now_s` from the samples taken up to then."""
        rec = apply_limits(self.recommend(history, fleet), fleet, self.limits)
        surplus = fleet.current - rec.desired
        drain = tuple(self.choose_drain(fleet, surplus)) if surplus > 0 else ()
        if len(drain) < surplus:  # the policy keeps some replicas it may not drain (loading ones)
            kept = surplus - len(drain)
            return ScalingDecision(rec.desired + kept, rec.reason, f"{rec.detail}; {kept} kept: not drainable", drain)
        return ScalingDecision(rec.desired, rec.reason, rec.detail, drain)

    @abc.abstractmethod
    def recommend(self, history: Sequence[ScalingSignals], fleet: FleetState) -> Recommendation:
        """The policy's own rule, before the shared limits apply."""

    def choose_drain(self, fleet: FleetState, count: int) -> list[str]:
        """Up to `count` replicas to remove (fewer where a policy protects some), in Kubernetes
        ReplicaSet order: not-ready (starting) first, then ready; newest first within each."""
        starting = sorted(fleet.in_state(ReplicaState.STARTING), key=lambda r: (-r.started_at_s, r.replica_id))
        ready = sorted(fleet.in_state(ReplicaState.READY), key=lambda r: (-r.started_at_s, r.replica_id))
        return [r.replica_id for r in (starting + ready)[:count]]

    def reset(self) -> None:  # noqa: B027 (an optional hook: a no-op unless overridden)
        """Forget remembered recommendations (the fleet was replaced wholesale)."""


def compare(desired: int, current: int) -> Reason:
    """The plain reason for a rule's count against the current count."""
    if desired > current:
        return Reason.SCALE_UP
    return Reason.SCALE_DOWN if desired < current else Reason.STEADY
