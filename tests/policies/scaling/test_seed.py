import pytest

from policies.scaling.base import ConfigError, FleetState, Reason, ReplicaInfo, ReplicaState, ScalingSignals
from policies.scaling.registry import create_policy
from policies.scaling.seed import SeedConfig


def steady_history(now_s: int, rate: float, waiting: float, length: int = 60) -> list[ScalingSignals]:
    return [ScalingSignals(t, arrival_rate_rps=rate, num_requests_waiting=waiting) for t in range(now_s - length + 1, now_s + 1)]


def ready_fleet(n: int, now_s: float = 59) -> FleetState:
    return FleetState(now_s, tuple(ReplicaInfo(f"r{i}", ReplicaState.READY, i, i + 60) for i in range(n)))


def test_two_requests_per_second_need_a_second_replica_at_80_percent() -> None:
    decision = create_policy("seed").decide(steady_history(29, 2.0, 0, length=30), ready_fleet(1, 29))
    assert (decision.desired, decision.reason) == (2, Reason.SCALE_UP)
    assert decision.detail == "ceil((2.00/s + 0 waiting / 60 s) / 1.6/s) = 2"


def test_waiting_requests_are_planned_to_drain_within_drain_s() -> None:
    # (8 + 60 / 60) / 1.6 = 5.625 -> 6
    decision = create_policy("seed").decide(steady_history(59, 8.0, 60), ready_fleet(2))
    assert decision.desired == 6


def test_rate_is_averaged_over_the_last_interval_only() -> None:
    history = [ScalingSignals(t, arrival_rate_rps=100.0 if t <= 29 else 1.0) for t in range(60)]
    # the samples of t = 30..59 average 1.0/s: ceil(1.0 / 1.6) = 1
    decision = create_policy("seed").decide(history, ready_fleet(1))
    assert (decision.desired, decision.reason) == (1, Reason.STEADY)


def test_like_the_lesson_it_never_scales_down_unless_told_to() -> None:
    history = steady_history(59, 8.0, 0)  # needs 5
    held = create_policy("seed").decide(history, ready_fleet(8))
    assert (held.desired, held.reason, held.drain) == (8, Reason.STEADY, ())
    down = create_policy("seed:scale_down=true").decide(history, ready_fleet(8))
    assert (down.desired, down.reason, down.drain) == (5, Reason.SCALE_DOWN, ("r7", "r6", "r5"))


def test_without_any_rate_sample_it_holds() -> None:
    decision = create_policy("seed").decide([ScalingSignals(59, num_requests_waiting=50)], ready_fleet(3))
    assert (decision.desired, decision.reason) == (3, Reason.NO_SIGNAL)


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"capacity_rps": 0}, "capacity_rps"),
    ({"target_utilization": 0}, "target_utilization"),
    ({"target_utilization": 1.2}, "target_utilization"),
    ({"drain_s": 0}, "drain_s"),
    ({"interval_s": -30}, "interval_s"),
])
def test_config_validation_names_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ConfigError) as exc:
        SeedConfig(**kwargs)
    assert exc.value.field == field
