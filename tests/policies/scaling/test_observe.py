from policies.scaling.base import FleetState, ReplicaInfo, ReplicaState, ScalingSignals
from policies.scaling.observe import METRICS, REASON_LABELS, STATE_LABELS, record
from policies.scaling.registry import create_policy


def test_record_counts_replicas_by_state_and_measures_the_cold_start() -> None:
    fleet = FleetState(500, (
        ReplicaInfo("a", ReplicaState.READY, 0, 70),
        ReplicaInfo("b", ReplicaState.READY, 100, 290),
        ReplicaInfo("c", ReplicaState.STARTING, 480),
        ReplicaInfo("d", ReplicaState.DRAINING, 50, 120),
    ))
    history = [ScalingSignals(t, arrival_rate_rps=8.0, num_requests_waiting=0) for t in range(471, 501)]
    decision = create_policy("seed").decide(history, fleet)
    rec = record("seed", fleet, decision)
    assert rec.replicas == {"starting": 1, "ready": 2, "draining": 1}
    assert (rec.desired, rec.reason, rec.policy, rec.at_s) == (5, "scale-up", "seed", 500)
    assert rec.cold_start_s == (70 + 190 + 70) / 3


def test_label_values_are_bounded_and_metric_names_carry_the_flotilla_prefix() -> None:
    assert set(STATE_LABELS) == {"starting", "ready", "draining"}
    assert "cooldown" in REASON_LABELS and "panic" in REASON_LABELS and len(REASON_LABELS) == 13
    assert all(name.startswith("flotilla_autoscaler_") for name in METRICS)
