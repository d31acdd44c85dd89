"""What the autoscaler reports about each decision, in the words its metrics use.

The proxy turns a `DecisionRecord` into Prometheus samples; keeping the names and the bounded
label values here means the proxy, the simulator and the docs cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.scaling.base import FleetState, Reason, ReplicaState, ScalingDecision, measured_cold_start_s

# metric name -> help text; label sets are fixed: replicas by `state`, decisions by `policy` and `reason`
METRICS: dict[str, str] = {
    "flotilla_autoscaler_desired_replicas": "Replicas the scaling policy wants (ready plus starting)",
    "flotilla_autoscaler_replicas": "Replicas by state: ready, starting, draining",
    "flotilla_autoscaler_decisions": "Scaling decisions by policy and reason",
    "flotilla_autoscaler_cold_start_seconds": "Measured launch-to-ready time of replicas (mean)",
}
# Every value the `reason` label can take, so counters can start at zero.
REASON_LABELS: tuple[str, ...] = tuple(r.value for r in Reason)
STATE_LABELS: tuple[str, ...] = tuple(s.value for s in ReplicaState)


@dataclass(frozen=True)
class DecisionRecord:
    """One decision and the fleet it was made for, flattened for metrics and logs."""

    at_s: float
    """Decision time on the autoscaler's clock (seconds)."""
    policy: str
    reason: str
    """A value of REASON_LABELS."""
    desired: int
    """Replicas wanted after the decision."""
    replicas: dict[str, int]
    """state label -> replicas in that state before the decision."""
    drain: tuple[str, ...]
    """Replica ids the decision drains."""
    cold_start_s: float | None
    """Measured mean cold start; None before any replica became ready."""


def record(policy_name: str, fleet: FleetState, decision: ScalingDecision) -> DecisionRecord:
    """Flatten a decision for the autoscaler's metrics."""
    counts = {state.value: len(fleet.in_state(state)) for state in ReplicaState}
    cold = fleet.cold_start_s if fleet.cold_start_s is not None else measured_cold_start_s(fleet.replicas)
    return DecisionRecord(fleet.now_s, policy_name, decision.reason.value, decision.desired, counts,
                          decision.drain, cold)
