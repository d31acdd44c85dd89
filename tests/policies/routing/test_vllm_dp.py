from __future__ import annotations

from policies.routing import RequestInfo, create_policy
from tests.policies.routing.harness import views


def test_score_weighs_waiting_four_times_running():
    # Scores 4*2+1 = 9, 4*0+8 = 8, 4*1+5 = 9.
    backends = views(3, num_requests_waiting=[2, 0, 1], num_requests_running=[1, 8, 5])
    d = create_policy("vllm-dp").select(backends, RequestInfo())
    assert (d.index, d.rule) == (1, "dp-score")


def test_kv_pressure_doubles_the_waiting_weight_above_half_full():
    backends = views(
        2, num_requests_waiting=[1, 2], num_requests_running=[0, 0], kv_cache_usage=[0.6, 0.2]
    )
    # Backend 0: 8*1 = 8 under pressure; backend 1: 4*2 = 8; the tie goes to index 0.
    d = create_policy("vllm-dp").select(backends, RequestInfo())
    assert (d.index, d.rule) == (0, "kv-pressure")
    # Without the KV term (vLLM's own score): 4 against 8.
    assert create_policy("vllm-dp:kv_pressure_factor=1").select(backends, RequestInfo()).index == 0
    heavier = views(
        2, num_requests_waiting=[2, 3], num_requests_running=[0, 0], kv_cache_usage=[0.6, 0.2]
    )
    assert create_policy("vllm-dp").select(heavier, RequestInfo()).index == 1
    assert create_policy("vllm-dp:kv_pressure_factor=1").select(heavier, RequestInfo()).index == 0


def test_backend_never_scraped_scores_its_in_flight_count():
    # Backend 0 scores 4*1 + 0 = 4; backend 1 has no metrics and scores its in-flight count.
    policy = create_policy("vllm-dp")
    for in_flight, expected in ((3, 1), (5, 0)):
        backends = views(2, num_requests_waiting=[1, None], num_requests_running=[0, None], in_flight=[0, in_flight])
        assert policy.select(backends, RequestInfo()).index == expected
