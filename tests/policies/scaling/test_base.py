import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.scaling.base import (
    ConfigError,
    FleetState,
    Reason,
    Recommendation,
    ReplicaInfo,
    ReplicaState,
    ScalingLimits,
    ScalingPolicy,
    ScalingSignals,
    apply_limits,
    measured_cold_start_s,
    signal_value,
    window_mean,
)
from policies.scaling.registry import create_policy

READY, STARTING, DRAINING = ReplicaState.READY, ReplicaState.STARTING, ReplicaState.DRAINING


def fleet(ready: int, starting: int = 0, now_s: float = 1000.0, last_scaled_at_s: float | None = None) -> FleetState:
    replicas = [ReplicaInfo(f"r{i}", READY, float(i), float(i) + 60) for i in range(ready)]
    replicas += [ReplicaInfo(f"s{i}", STARTING, now_s - 10 + i) for i in range(starting)]
    return FleetState(now_s, tuple(replicas), 60.0, last_scaled_at_s)


def test_fleet_counts_ready_and_starting_but_not_draining() -> None:
    f = FleetState(0, (ReplicaInfo("a", READY, 0), ReplicaInfo("b", STARTING, 0), ReplicaInfo("c", DRAINING, 0)))
    assert (f.ready, f.starting, f.draining, f.current) == (1, 1, 1, 2)


def test_waiting_and_running_fall_back_to_llama_cpp_names_and_concurrency_sums_them() -> None:
    s = ScalingSignals(0, requests_deferred=3, requests_processing=4)
    assert (s.waiting, s.running, signal_value(s, "concurrency")) == (3, 4, 7)
    vllm = ScalingSignals(0, num_requests_waiting=2, requests_deferred=9, num_requests_running=5)
    assert (vllm.waiting, vllm.running) == (2, 5)


def test_window_mean_excludes_the_window_start_includes_now_and_skips_absent_values() -> None:
    history = [ScalingSignals(t, arrival_rate_rps=float(t)) for t in range(10)]
    history.append(ScalingSignals(10))  # no rate reported
    assert window_mean(history, "arrival_rate_rps", now_s=10, window_s=4) == (7 + 8 + 9) / 3
    assert window_mean(history, "kv_cache_usage", now_s=10, window_s=4) is None


def test_measured_cold_start_is_the_mean_launch_to_ready_time() -> None:
    reps = [ReplicaInfo("a", READY, 10, 80), ReplicaInfo("b", READY, 20, 210), ReplicaInfo("c", STARTING, 30)]
    assert measured_cold_start_s(reps) == 130.0
    assert measured_cold_start_s(reps[2:]) is None


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"min_replicas": -1}, "min_replicas"),
    ({"min_replicas": 3, "max_replicas": 2}, "max_replicas"),
    ({"min_replicas": 0, "max_replicas": 0}, "max_replicas"),
    ({"max_scale_up_step": 0}, "max_scale_up_step"),
    ({"scale_down_cooldown_s": -1}, "scale_down_cooldown_s"),
])
def test_limits_validation_names_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ConfigError) as exc:
        ScalingLimits(**kwargs)
    assert exc.value.field == field


def rec(n: int) -> Recommendation:
    return Recommendation(n, Reason.SCALE_UP, "rule")


def test_limits_cap_at_max_and_raise_to_min() -> None:
    limits = ScalingLimits(min_replicas=2, max_replicas=6)
    assert apply_limits(rec(9), fleet(3), limits) == Recommendation(6, Reason.MAX_REPLICAS, "rule; capped at max_replicas")
    low = apply_limits(Recommendation(0, Reason.SCALE_DOWN), fleet(3), ScalingLimits(min_replicas=2, scale_down_cooldown_s=0))
    assert (low.desired, low.reason) == (2, Reason.MIN_REPLICAS)


def test_max_scale_up_step_counts_from_ready_plus_starting() -> None:
    out = apply_limits(rec(10), fleet(2, starting=1), ScalingLimits(max_scale_up_step=2))
    assert (out.desired, out.reason) == (5, Reason.MAX_STEP)


def test_cooldown_holds_a_scale_down_but_never_a_scale_up() -> None:
    limits = ScalingLimits(scale_down_cooldown_s=300)
    down = Recommendation(2, Reason.SCALE_DOWN)
    assert apply_limits(down, fleet(5, now_s=1000, last_scaled_at_s=701), limits).desired == 5
    assert apply_limits(down, fleet(5, now_s=1000, last_scaled_at_s=701), limits).reason is Reason.COOLDOWN
    assert apply_limits(down, fleet(5, now_s=1000, last_scaled_at_s=700), limits).desired == 2
    assert apply_limits(down, fleet(5, now_s=1000, last_scaled_at_s=None), limits).desired == 2
    assert apply_limits(rec(7), fleet(5, now_s=1000, last_scaled_at_s=999), limits).desired == 7


def test_cooldown_does_not_keep_a_fleet_above_max_replicas() -> None:
    out = apply_limits(Recommendation(4, Reason.SCALE_DOWN), fleet(8, last_scaled_at_s=999), ScalingLimits(max_replicas=6))
    assert (out.desired, out.reason) == (6, Reason.MAX_REPLICAS)


def test_max_step_also_applies_when_the_ceiling_cut_the_recommendation() -> None:
    out = apply_limits(rec(9), fleet(0), ScalingLimits(max_replicas=6, max_scale_up_step=2))
    assert (out.desired, out.reason) == (2, Reason.MAX_STEP)


class Fixed(ScalingPolicy):
    name = "fixed"

    def recommend(self, history, fleet):  # type: ignore[no-untyped-def]
        return Recommendation(self.config, Reason.SCALE_DOWN)


def test_default_drain_order_is_kubernetes_starting_first_then_newest_ready() -> None:
    policy = Fixed(config=1, limits=ScalingLimits(scale_down_cooldown_s=0))
    decision = policy.decide([], fleet(3, starting=2))
    assert decision.desired == 1
    assert decision.drain == ("s1", "s0", "r2", "r1")
    assert decision.reason_label == "scale-down"


def test_interval_defaults_to_15_s_without_a_config_field() -> None:
    assert Fixed(config=1).interval_s == 15.0


@pytest.mark.parametrize("spec", ["seed", "target-tracking", "kpa:min_replicas=0", "cold-start-aware"])
def test_every_policy_starts_a_replica_for_requests_held_by_an_empty_fleet(spec: str) -> None:
    held = [ScalingSignals(t, arrival_rate_rps=0.5, num_requests_waiting=3) for t in range(31)]
    decision = create_policy(spec).decide(held, FleetState(30))
    assert (decision.desired, decision.drain) == (1, ())


@pytest.mark.parametrize("spec", ["seed:min_replicas=0", "target-tracking:min_replicas=0",
                                  "kpa:min_replicas=0", "cold-start-aware:min_replicas=0"])
def test_no_policy_starts_a_replica_for_an_idle_empty_fleet(spec: str) -> None:
    idle = [ScalingSignals(t, arrival_rate_rps=0.0, num_requests_waiting=0, num_requests_running=0) for t in range(31)]
    assert create_policy(spec).decide(idle, FleetState(30)).desired == 0


replica_states = st.sampled_from([READY, STARTING, DRAINING])


@st.composite
def fleets(draw: st.DrawFn) -> FleetState:
    states = draw(st.lists(replica_states, max_size=12))
    now_s = 600.0
    replicas = tuple(
        ReplicaInfo(f"r{i}", s, draw(st.floats(0, 590)), None if s is STARTING else 599.0,
                    in_flight=draw(st.integers(0, 5)), unique_cached_prefixes=draw(st.integers(0, 5)))
        for i, s in enumerate(states))
    last = draw(st.one_of(st.none(), st.floats(0, 600)))
    return FleetState(now_s, replicas, draw(st.one_of(st.none(), st.floats(1, 300))), last)


@st.composite
def histories(draw: st.DrawFn) -> list[ScalingSignals]:
    rate = draw(st.floats(0, 50))
    waiting = draw(st.floats(0, 500))
    running = draw(st.floats(0, 100))
    return [ScalingSignals(float(t), arrival_rate_rps=rate, num_requests_waiting=waiting,
                           num_requests_running=running) for t in range(300, 601)]


@settings(max_examples=60, deadline=None)
@given(spec=st.sampled_from(["seed:scale_down=true", "target-tracking", "kpa", "cold-start-aware"]),
       fleet=fleets(), history=histories(), min_replicas=st.integers(0, 3), max_replicas=st.integers(3, 8),
       step=st.one_of(st.none(), st.integers(1, 3)))
def test_every_decision_honours_the_limits_and_drains_exactly_the_surplus(
        spec: str, fleet: FleetState, history: list[ScalingSignals],
        min_replicas: int, max_replicas: int, step: int | None) -> None:
    limits = f"min_replicas={min_replicas},max_replicas={max_replicas},max_scale_up_step={step}"
    policy = create_policy(f"{spec},{limits}" if ":" in spec else f"{spec}:{limits}")
    decision = policy.decide(history, fleet)
    by_id = {r.replica_id: r for r in fleet.replicas}
    assert len(decision.drain) == max(0, fleet.current - decision.desired)
    assert len(set(decision.drain)) == len(decision.drain)
    assert all(by_id[rid].state is not DRAINING for rid in decision.drain)
    if decision.desired > fleet.current:
        assert decision.desired <= max_replicas
        assert step is None or decision.desired - fleet.current <= step
    if spec == "cold-start-aware":
        assert all(by_id[rid].state is READY for rid in decision.drain)
        assert decision.desired <= max(max_replicas, fleet.current) or decision.reason is Reason.MIN_REPLICAS
    else:
        assert decision.desired <= max(max_replicas, fleet.current)
    if decision.desired < fleet.current:
        assert decision.desired >= min_replicas
