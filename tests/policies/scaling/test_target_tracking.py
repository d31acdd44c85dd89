import pytest

from policies.scaling.base import ConfigError, FleetState, Reason, ReplicaInfo, ReplicaState, ScalingSignals
from policies.scaling.registry import create_policy
from policies.scaling.target_tracking import TargetTrackingConfig


def ready_fleet(n: int, now_s: float) -> FleetState:
    return FleetState(now_s, tuple(ReplicaInfo(f"r{i}", ReplicaState.READY, i, i + 60) for i in range(n)))


def waiting(now_s: float, total: float) -> list[ScalingSignals]:
    return [ScalingSignals(now_s, num_requests_waiting=total)]


@pytest.mark.parametrize(("total_waiting", "desired", "reason"), [
    (21.6, 4, Reason.TOLERANCE),  # 5.4 per replica: ratio 1.08, inside 1 +- 0.1
    (18.0, 4, Reason.TOLERANCE),  # ratio 0.9, on the edge of the band
    (22.4, 5, Reason.SCALE_UP),  # ratio 1.12: ceil(4 x 1.12) = 5
    (40.0, 8, Reason.SCALE_UP),  # ratio 2: ceil(4 x 2) = 8
])
def test_hpa_rule_with_its_tolerance_band(total_waiting: float, desired: int, reason: Reason) -> None:
    decision = create_policy("target-tracking").decide(waiting(0, total_waiting), ready_fleet(4, 0))
    assert (decision.desired, decision.reason) == (desired, reason)


def test_scale_down_waits_for_the_highest_recommendation_of_the_last_300_s() -> None:
    policy = create_policy("target-tracking:scale_down_cooldown_s=0")
    assert policy.decide(waiting(0, 40), ready_fleet(4, 0)).desired == 8
    calm = policy.decide(waiting(15, 10), ready_fleet(8, 15))  # raw ceil(8 x 0.25) = 2
    assert (calm.desired, calm.reason, calm.drain) == (8, Reason.STABILIZED, ())
    assert policy.decide(waiting(299, 10), ready_fleet(8, 299)).desired == 8
    later = policy.decide(waiting(300, 10), ready_fleet(8, 300))  # the t=0 recommendation has aged out
    assert (later.desired, later.reason) == (2, Reason.SCALE_DOWN)
    assert later.drain == ("r7", "r6", "r5", "r4", "r3", "r2")


def test_scale_up_acts_at_once_with_the_0_s_up_window() -> None:
    policy = create_policy("target-tracking")
    policy.decide(waiting(0, 5), ready_fleet(1, 0))
    assert policy.decide(waiting(15, 30), ready_fleet(1, 15)).desired == 6


def test_averaged_signals_are_not_divided_by_the_ready_count() -> None:
    policy = create_policy("target-tracking:metric=kv_cache_usage,target=0.5")
    decision = policy.decide([ScalingSignals(0, kv_cache_usage=0.9)], ready_fleet(3, 0))
    assert decision.desired == 6  # ceil(3 x 0.9 / 0.5) = ceil(5.4)


def test_with_no_ready_replica_it_holds_at_least_one() -> None:
    starting = FleetState(0, (ReplicaInfo("s0", ReplicaState.STARTING, 0),))
    decision = create_policy("target-tracking").decide(waiting(0, 100), starting)
    assert (decision.desired, decision.reason, decision.drain) == (1, Reason.NO_SIGNAL, ())


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"metric": "gpu_utilization"}, "metric"),
    ({"target": 0}, "target"),
    ({"tolerance": 1.0}, "tolerance"),
    ({"down_window_s": -1}, "down_window_s"),
])
def test_config_validation_names_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ConfigError) as exc:
        TargetTrackingConfig(**kwargs)
    assert exc.value.field == field
