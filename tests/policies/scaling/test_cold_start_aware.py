import pytest

from policies.scaling.base import ConfigError, FleetState, Reason, ReplicaInfo, ReplicaState, ScalingSignals
from policies.scaling.cold_start_aware import ColdStartAwareConfig
from policies.scaling.registry import create_policy

NOW = 1000.0


def replica(rid: str, state: ReplicaState = ReplicaState.READY, started_at_s: float = 0.0, **load: int) -> ReplicaInfo:
    ready_at = started_at_s + 60 if state is ReplicaState.READY else None
    return ReplicaInfo(rid, state, started_at_s, ready_at, **load)


def history(rate: float, waiting: float) -> list[ScalingSignals]:
    return [ScalingSignals(t, arrival_rate_rps=rate, num_requests_waiting=waiting) for t in range(int(NOW) - 59, int(NOW) + 1)]


def test_projected_queue_counts_starting_replicas_from_their_expected_ready_time() -> None:
    # 2 ready (4 req/s) and one launched 60 s ago with a 100 s cold start, so serving from NOW + 40.
    fleet = FleetState(NOW, (replica("a"), replica("b"), replica("s", ReplicaState.STARTING, NOW - 60)), 100.0)
    policy = create_policy("cold-start-aware")
    # seconds NOW+1..NOW+39 grow the queue by 8 - 4, seconds NOW+40..NOW+100 by 8 - 6
    assert policy.project_queue(100.0, 8.0, fleet, 100.0) == 100 + 39 * 4 + 61 * 2


def test_adds_only_what_the_queue_left_at_the_end_of_a_cold_start_needs_where_seed_adds_more() -> None:
    starting = tuple(replica(f"s{i}", ReplicaState.STARTING, NOW - 150) for i in range(3))
    fleet = FleetState(NOW, (replica("a"), replica("b"), *starting), 190.0)
    # queue 300 + 39 s x (8 - 4) = 456, then 151 s x (8 - 10) = -302: 154 left when a new replica could serve
    decision = create_policy("cold-start-aware").decide(history(8.0, 300), fleet)
    assert (decision.desired, decision.reason) == (7, Reason.SCALE_UP)  # ceil((8 + 154 / 60) / 1.6)
    assert "queue projected to 154 in 190 s with 3 starting" in decision.detail
    assert create_policy("seed").decide(history(8.0, 300), fleet).desired == 9  # ceil((8 + 300 / 60) / 1.6)


def test_without_a_measured_cold_start_it_assumes_the_configured_one() -> None:
    fleet = FleetState(NOW, (replica("a"),), None)
    policy = create_policy("cold-start-aware:cold_start_s=30")
    # 1 ready serves 2 of 4 req/s: 30 s add 60 waiting -> ceil((4 + 60 / 60) / 1.6) = 4
    assert policy.decide(history(4.0, 0), fleet).desired == 4


def test_never_scales_down_while_a_replica_is_loading() -> None:
    fleet = FleetState(NOW, (replica("a"), replica("b"), replica("c"), replica("s", ReplicaState.STARTING, NOW - 5)), 60.0)
    decision = create_policy("cold-start-aware:scale_down_cooldown_s=0").decide(history(0.5, 0), fleet)
    assert (decision.desired, decision.reason, decision.drain) == (4, Reason.STARTING_HOLD, ())


def test_never_drains_a_starting_replica_even_above_max_replicas() -> None:
    loading = tuple(replica(f"s{i}", ReplicaState.STARTING, NOW - 5) for i in range(2))
    fleet = FleetState(NOW, (replica("a"), replica("b"), *loading), 60.0)
    decision = create_policy("cold-start-aware:max_replicas=1").decide(history(8.0, 0), fleet)
    # the ceiling drains both ready replicas; the two loading ones stay until they are ready
    assert (decision.desired, decision.drain) == (2, ("a", "b"))
    assert decision.detail.endswith("; 1 kept: not drainable")


def test_drains_the_replicas_whose_loss_costs_least() -> None:
    fleet = FleetState(NOW, (
        replica("busy", in_flight=3),
        replica("cached", unique_cached_prefixes=40),
        replica("sessions", pinned_sessions=2, unique_cached_prefixes=1),
        replica("idle-old", started_at_s=10),
        replica("idle-new", started_at_s=20),
    ), 60.0)
    # 1 req/s needs ceil(1 / 1.6) = 1 replica: drain four, keeping the one with in-flight requests
    decision = create_policy("cold-start-aware:scale_down_cooldown_s=0").decide(history(1.0, 0), fleet)
    assert decision.desired == 1
    assert decision.drain == ("idle-new", "idle-old", "sessions", "cached")


def test_trend_extends_a_rising_rate_by_its_last_rise() -> None:
    rising = [ScalingSignals(t, arrival_rate_rps=2.0 if t <= NOW - 30 else 4.0, num_requests_waiting=0)
              for t in range(int(NOW) - 59, int(NOW) + 1)]
    fleet = FleetState(NOW, tuple(replica(f"r{i}") for i in range(4)), 60.0)
    assert create_policy("cold-start-aware").decide(rising, fleet).desired == 3  # ceil(4 / 1.6)
    assert create_policy("cold-start-aware:trend=true").decide(rising, fleet).desired == 4  # ceil(6 / 1.6)


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"cold_start_s": -1}, "cold_start_s"),
    ({"capacity_rps": -2}, "capacity_rps"),
    ({"target_utilization": 2}, "target_utilization"),
])
def test_config_validation_names_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ConfigError) as exc:
        ColdStartAwareConfig(**kwargs)
    assert exc.value.field == field
