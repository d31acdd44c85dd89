"""The autoscaler's series on the proxy's /metrics, in the names the dashboards query.

Names and label values come from `policies.scaling.observe`, so decisions by every reason start
at zero and the dashboards, the simulator and the proxy agree.
"""

from __future__ import annotations

import weakref

from prometheus_client import CollectorRegistry, Counter, Gauge

from policies.scaling.observe import METRICS, REASON_LABELS, STATE_LABELS, DecisionRecord

_FAMILIES: weakref.WeakKeyDictionary[CollectorRegistry, AutoscalerMetrics] = weakref.WeakKeyDictionary()
"""The first autoscaler's metrics of each registry: a P/D proxy's second one shares its families."""


class AutoscalerMetrics:
    def __init__(self, registry: CollectorRegistry, policy: str, pool: str = "default") -> None:
        self.policy = policy
        first = _FAMILIES.get(registry)
        self.owns_fleet_series = first is None
        """False for a P/D proxy's second autoscaler (the prefill pool's): it adds its desired
        count {pool} and decisions {policy}; the unlabelled replica, cold-start and holding
        series stay the first one's."""
        if first is not None:
            self._share(first, policy, pool)
            return
        _FAMILIES[registry] = self
        # With `--workers N` only the leader's autoscaler sets the fleet series (the others stay
        # at 0, so the live workers' max is the leader's); every worker holds requests (summed).
        self._desired_family = Gauge("flotilla_autoscaler_desired_replicas",
                                     METRICS["flotilla_autoscaler_desired_replicas"], ["pool"], registry=registry,
                                     multiprocess_mode="livemax")
        # labelled by pool, so the Prometheus adapter (HPA) or KEDA selects the pool it scales
        self.desired = self._desired_family.labels(pool)
        self.replicas = Gauge("flotilla_autoscaler_replicas", METRICS["flotilla_autoscaler_replicas"], ["state"],
                              registry=registry, multiprocess_mode="livemax")
        self.decisions = Counter("flotilla_autoscaler_decisions", METRICS["flotilla_autoscaler_decisions"],
                                 ["policy", "reason"], registry=registry)
        self.cold_start = Gauge("flotilla_autoscaler_cold_start_seconds",
                                METRICS["flotilla_autoscaler_cold_start_seconds"], registry=registry,
                                multiprocess_mode="livemax")
        self.arrivals = Counter("flotilla_autoscaler_arrivals", "Requests that reached the proxy, counted "
                                "before routing or holding", registry=registry)
        self.held = Gauge("flotilla_autoscaler_held_requests", "Requests held while no replica is ready",
                          registry=registry, multiprocess_mode="livesum")
        self.hold_rejections = Counter("flotilla_autoscaler_hold_rejections",
                                       "Requests answered 503 because the hold bound was reached", registry=registry)
        for reason in REASON_LABELS:
            self.decisions.labels(policy, reason)
        for state in STATE_LABELS:
            self.replicas.labels(state).set(0)

    def _share(self, first: AutoscalerMetrics, policy: str, pool: str) -> None:
        self._desired_family = first._desired_family
        self.desired = first._desired_family.labels(pool)
        self.decisions, self.replicas, self.cold_start = first.decisions, first.replicas, first.cold_start
        self.arrivals, self.held, self.hold_rejections = first.arrivals, first.held, first.hold_rejections
        for reason in REASON_LABELS:
            self.decisions.labels(policy, reason)

    def observe(self, record: DecisionRecord) -> None:
        """One decision of the loop."""
        self.desired.set(record.desired)
        self.decisions.labels(record.policy, record.reason).inc()
        self.set_replicas(record.replicas, record.cold_start_s)

    def set_replicas(self, counts: dict[str, int], cold_start_s: float | None) -> None:
        if not self.owns_fleet_series:
            return
        for state, count in counts.items():
            self.replicas.labels(state).set(count)
        if cold_start_s is not None:
            self.cold_start.set(cold_start_s)
