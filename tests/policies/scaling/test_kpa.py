import pytest

from policies.scaling.base import ConfigError, FleetState, Reason, ReplicaInfo, ReplicaState, ScalingSignals
from policies.scaling.kpa import KpaConfig
from policies.scaling.registry import create_policy


def ready_fleet(n: int, now_s: float) -> FleetState:
    return FleetState(now_s, tuple(ReplicaInfo(f"r{i}", ReplicaState.READY, i, i + 60) for i in range(n)))


def load(concurrency_by_second: dict[int, float]) -> list[ScalingSignals]:
    return [ScalingSignals(t, num_requests_running=c, num_requests_waiting=0) for t, c in concurrency_by_second.items()]


def test_stable_rule_is_the_60_s_mean_concurrency_over_the_target() -> None:
    history = load({t: 25.0 for t in range(60)})
    decision = create_policy("kpa").decide(history, ready_fleet(2, 59))
    assert (decision.desired, decision.reason) == (3, Reason.SCALE_UP)  # ceil(25 / 10)


def test_a_burst_in_the_6_s_window_enters_panic_and_scales_on_the_panic_count() -> None:
    # 54 s at 10 then 6 s at 50: stable mean 14 -> 2, panic mean 50 -> 5 = 2.5 x 2 ready
    history = load({t: 10.0 if t < 54 else 50.0 for t in range(60)})
    policy = create_policy("kpa")
    decision = policy.decide(history, ready_fleet(2, 59))
    assert (decision.desired, decision.reason) == (5, Reason.PANIC)


@pytest.mark.parametrize(("burst", "desired", "reason"), [
    (30.0, 2, Reason.STEADY),  # panic 3 is 1.5 x the 2 ready: the stable count (mean 12 -> 2) rules
    (40.0, 4, Reason.PANIC),  # panic 4 is exactly 2.0 x the 2 ready: panic
])
def test_panic_threshold_is_panic_count_over_ready_at_least_2(burst: float, desired: int, reason: Reason) -> None:
    history = load({t: 10.0 if t < 54 else burst for t in range(60)})
    decision = create_policy("kpa").decide(history, ready_fleet(2, 59))
    assert (decision.desired, decision.reason) == (desired, reason)


def test_panic_never_scales_down_and_ends_a_stable_window_after_the_last_burst() -> None:
    policy = create_policy("kpa:scale_down_cooldown_s=0")
    conc = {t: 10.0 if t < 54 else 50.0 for t in range(60)}
    assert policy.decide(load(conc), ready_fleet(2, 59)).desired == 5
    conc.update({t: 10.0 for t in range(60, 200)})  # the burst is over
    during = policy.decide(load(conc), ready_fleet(5, 119))
    assert (during.desired, during.reason, during.drain) == (5, Reason.PANIC, ())
    after = policy.decide(load(conc), ready_fleet(5, 120))  # 59 + 60 < 120: panic over
    # stable asks ceil(10 / 10) = 1; one decision at most halves the fleet: floor(5 / 2) = 2
    assert (after.desired, after.reason) == (2, Reason.SCALE_DOWN)
    assert not policy.panicking


def test_scale_down_per_decision_is_bounded_by_the_max_scale_down_rate() -> None:
    decision = create_policy("kpa:scale_down_cooldown_s=0").decide(load({0: 0.0}), ready_fleet(8, 0))
    assert decision.desired == 4  # floor(8 / 2)


def test_scale_to_zero_waits_for_the_grace_period() -> None:
    policy = create_policy("kpa:min_replicas=0")
    idle = {t: 0.0 for t in range(200)}
    first = policy.decide(load(idle), ready_fleet(1, 100))
    assert (first.desired, first.reason) == (1, Reason.SCALE_TO_ZERO_GRACE)
    assert policy.decide(load(idle), ready_fleet(1, 129)).desired == 1
    gone = policy.decide(load(idle), ready_fleet(1, 130))
    assert (gone.desired, gone.drain) == (0, ("r0",))


def test_traffic_during_the_grace_period_restarts_it() -> None:
    policy = create_policy("kpa:min_replicas=0,stable_window_s=6")
    conc = {t: 0.0 for t in range(200)}
    policy.decide(load(conc), ready_fleet(1, 100))
    conc[110] = 5.0
    assert policy.decide(load(conc), ready_fleet(1, 110)).reason is Reason.STEADY
    assert policy.decide(load(conc), ready_fleet(1, 120)).reason is Reason.SCALE_TO_ZERO_GRACE
    assert policy.decide(load(conc), ready_fleet(1, 149)).desired == 1
    assert policy.decide(load(conc), ready_fleet(1, 150)).desired == 0


def test_with_min_replicas_1_the_last_replica_stays() -> None:
    policy = create_policy("kpa")
    idle = {t: 0.0 for t in range(200)}
    policy.decide(load(idle), ready_fleet(1, 100))
    decision = policy.decide(load(idle), ready_fleet(1, 140))
    assert (decision.desired, decision.reason) == (1, Reason.MIN_REPLICAS)


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"panic_window_s": 90}, "panic_window_s"),
    ({"panic_threshold": 0.5}, "panic_threshold"),
    ({"target": 0}, "target"),
    ({"metric": "nope"}, "metric"),
    ({"scale_to_zero_grace_s": -1}, "scale_to_zero_grace_s"),
])
def test_config_validation_names_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ConfigError) as exc:
        KpaConfig(**kwargs)
    assert exc.value.field == field
