"""`slo-capacity`: replicas for the work at the arriving lengths (sustained over a cold start,
and in a burst), the queue held to the TTFT SLO, capacity given back after hold_s, cheapest
replica first."""

import pytest

from policies.scaling.base import ConfigError, FleetState, Reason, ReplicaInfo, ReplicaState, ScalingSignals
from policies.scaling.registry import create_policy

NOW = 1000.0


def ready(rid: str, started_at_s: float = 0.0, **load: int) -> ReplicaInfo:
    return ReplicaInfo(rid, ReplicaState.READY, started_at_s, started_at_s + 60, **load)


def sample(at_s: float, rate: float, waiting: float = 0.0, capacity: float | None = None) -> ScalingSignals:
    return ScalingSignals(at_s, arrival_rate_rps=rate, num_requests_waiting=waiting, replica_capacity_rps=capacity)


def test_sizes_by_the_capacity_model_rate_at_the_arriving_lengths() -> None:
    fleet = FleetState(NOW, (ready("a"),), 60.0)
    # long prompts: 4 req/s full-batch, so 2 per replica at 50 %: 5 req/s need 3
    assert create_policy("slo-capacity:target_utilization=0.5").decide(
        [sample(NOW, 5.0, capacity=4.0)], fleet).desired == 3
    # short prompts: 20 req/s full-batch, 10 per replica: one is enough
    assert create_policy("slo-capacity:target_utilization=0.5").decide(
        [sample(NOW, 5.0, capacity=20.0)], fleet).desired == 1


def test_the_sustained_load_is_the_mean_over_one_measured_cold_start() -> None:
    policy = create_policy("slo-capacity:target_utilization=0.5,burst_utilization=1")
    # 8 req/s in the last 30 s, 0 in the 30 s before, 2 full-batch per replica: a 60 s cold start
    # averages 4 req/s = 2 busy replicas, 4 at 50 %; a 30 s one sees only the 8 req/s: 8
    history = [sample(NOW - 55 + 5 * i, 0.0 if i < 6 else 8.0, capacity=2.0) for i in range(12)]
    assert policy.decide(history, FleetState(NOW, (ready("a"),), 60.0)).desired == 4
    policy.reset()
    assert policy.decide(history, FleetState(NOW, (ready("a"),), 30.0)).desired == 8


def test_a_burst_shorter_than_a_cold_start_sizes_the_fleet_by_the_burst_utilization() -> None:
    policy = create_policy("slo-capacity:target_utilization=0.5,burst_utilization=0.5")
    # 11 quiet samples at 1 req/s, then 5 s at 12 req/s; 4 full-batch per replica: the mean
    # load is 1.92 / 4 = 0.48 replicas (1 at 50 %), the burst 3 replicas, 6 at 50 %
    history = [sample(NOW - 55 + 5 * i, 1.0 if i < 11 else 12.0, capacity=4.0) for i in range(12)]
    decision = policy.decide(history, FleetState(NOW, (ready("a"),), 60.0))
    assert (decision.desired, decision.reason) == (6, Reason.SCALE_UP)


def test_a_backlog_adds_what_clears_it_within_a_cold_start_plus_the_ttft_slo() -> None:
    policy = create_policy("slo-capacity:target_utilization=1,burst_utilization=1,ttft_slo_s=1")
    fleet = FleetState(NOW, (ready("a"),), 60.0)
    # 2 req/s at 2 per replica, plus 244 waiting over 61 s = 4 req/s more: ceil(6 / 2) = 3
    decision = policy.decide([sample(NOW, 2.0, waiting=244, capacity=2.0)], fleet)
    assert (decision.desired, decision.reason) == (3, Reason.SCALE_UP)


def test_holds_a_burst_size_for_hold_s_then_steps_down_one_replica_sparing_warm_caches() -> None:
    policy = create_policy("slo-capacity:target_utilization=1,burst_utilization=1,hold_s=100")
    fleet = FleetState(NOW, tuple(ready(r, unique_cached_prefixes=n) for r, n in (("a", 5), ("b", 0), ("c", 9))), 60.0)
    history = [sample(NOW, 6.0, capacity=2.0)]
    assert policy.decide(history, fleet).desired == 3
    history += [sample(NOW + t, 0.5, capacity=2.0) for t in range(5, 105, 5)]
    quiet = FleetState(NOW + 50, fleet.replicas, 60.0)
    assert policy.decide(history[:11], quiet).desired == 3  # the burst is remembered
    later = FleetState(NOW + 100, fleet.replicas, 60.0)
    decision = policy.decide(history, later)
    assert (decision.desired, decision.reason, decision.drain) == (2, Reason.SCALE_DOWN, ("b",))


def test_its_own_scale_down_cooldown_replaces_the_shared_default() -> None:
    assert create_policy("slo-capacity").limits.scale_down_cooldown_s == 120
    assert create_policy("slo-capacity:scale_down_cooldown_s=0").limits.scale_down_cooldown_s == 0
    policy = create_policy("slo-capacity:hold_s=0")
    fleet = FleetState(NOW, (ready("a"), ready("b")), 60.0, last_scaled_at_s=NOW - 100)
    decision = policy.decide([sample(NOW, 0.1, capacity=2.0)], fleet)
    assert (decision.desired, decision.reason) == (2, Reason.COOLDOWN)
    later = FleetState(NOW + 20, fleet.replicas, 60.0, last_scaled_at_s=NOW - 100)
    assert policy.decide([sample(NOW + 20, 0.1, capacity=2.0)], later).desired == 1


def test_never_scales_down_while_a_replica_is_loading() -> None:
    policy = create_policy("slo-capacity:hold_s=0,scale_down_cooldown_s=0")
    loading = ReplicaInfo("s", ReplicaState.STARTING, NOW - 10)
    decision = policy.decide([sample(NOW, 0.1)], FleetState(NOW, (ready("a"), ready("b"), loading), 60.0))
    assert (decision.desired, decision.reason) == (3, Reason.STARTING_HOLD)


def test_without_a_reported_capacity_it_uses_the_configured_one() -> None:
    policy = create_policy("slo-capacity:capacity_rps=10,target_utilization=0.5,burst_utilization=0.5")
    assert policy.decide([sample(NOW, 12.0)], FleetState(NOW, (ready("a"),), 60.0)).desired == 3


def test_bad_settings_name_the_field() -> None:
    with pytest.raises(ConfigError, match="target_utilization"):
        create_policy("slo-capacity:target_utilization=0")
    with pytest.raises(ConfigError, match="burst_utilization"):
        create_policy("slo-capacity:burst_utilization=1.5")
    with pytest.raises(ConfigError, match="max_scale_down"):
        create_policy("slo-capacity:max_scale_down=0")
