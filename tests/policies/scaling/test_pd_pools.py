"""pd-prefill and pd-decode: each pool scales on its own load and latency signals."""

from __future__ import annotations

import pytest

from policies.scaling import (
    ConfigError,
    FleetState,
    Reason,
    ReplicaInfo,
    ReplicaState,
    ScalingSignals,
    create_policy,
)


def _fleet(ready: int, now_s: float = 100.0) -> FleetState:
    return FleetState(now_s=now_s, replicas=tuple(ReplicaInfo(str(i), ReplicaState.READY, 0.0, 1.0)
                                                  for i in range(ready)))


def test_prefill_scales_on_queued_prompts_or_ttft_whichever_is_worse() -> None:
    policy = create_policy("pd-prefill:latency_slo_s=1.0,load_target=2,scale_down_cooldown_s=0")
    queue = policy.decide([ScalingSignals(at_s=100.0, num_requests_waiting=12.0)], _fleet(2))
    assert queue.desired == 4 and queue.reason is Reason.SCALE_UP  # 6 a replica / 2 = 3x, capped at 2x
    ttft = policy.decide([ScalingSignals(at_s=100.0, num_requests_waiting=0.0, ttft_p90_s=1.5)], _fleet(2))
    assert ttft.desired == 3 and "ttft_p90_s over target" in ttft.detail  # ceil(2 x 1.5)
    # the decode pool's signals do not move the prefill pool
    idle = policy.decide([ScalingSignals(at_s=100.0, num_requests_waiting=0.0, kv_cache_usage=0.99,
                                         tpot_p90_s=9.0, ttft_p90_s=0.1)], _fleet(3))
    assert idle.desired == 2 and idle.reason is Reason.SCALE_DOWN and len(idle.drain) == 1


def test_decode_scales_on_kv_usage_or_tpot_and_holds_in_between() -> None:
    policy = create_policy("pd-decode:scale_down_cooldown_s=0")
    assert policy.decide([ScalingSignals(at_s=1.0, kv_cache_usage=0.96)], _fleet(4)).desired == 5  # 0.96/0.8
    assert policy.decide([ScalingSignals(at_s=1.0, kv_cache_usage=0.2, tpot_p90_s=0.15)], _fleet(2)).desired == 3
    hold = policy.decide([ScalingSignals(at_s=1.0, kv_cache_usage=0.5, tpot_p90_s=0.05,
                                         num_requests_waiting=50.0)], _fleet(2))
    assert hold.desired == 2 and hold.reason is Reason.TOLERANCE  # a prefill queue is not decode's load
    assert policy.decide([], _fleet(2)).reason is Reason.NO_SIGNAL


def test_pool_policy_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match="latency_metric"):
        create_policy("pd-decode:latency_metric=nonsense")
    with pytest.raises(ConfigError, match="max_up_factor"):
        create_policy("pd-prefill:max_up_factor=1")
