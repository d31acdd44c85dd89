from __future__ import annotations

from policies.routing import RequestInfo, create_policy
from tests.policies.routing.harness import views


def test_least_value_of_the_chosen_signal_wins():
    backends = views(3, in_flight=[0, 5, 9], prefill_tokens=[900.0, 100.0, 500.0], kv_cache_usage=[0.9, 0.8, 0.1])
    assert create_policy("least-load").select(backends, RequestInfo()).index == 0
    assert create_policy("least-load:signal=prefill_tokens").select(backends, RequestInfo()).index == 1
    decision = create_policy("least-load:signal=kv_cache_usage").select(backends, RequestInfo())
    assert (decision.index, decision.rule) == (2, "least-load")


def test_engine_metric_signal_reads_backend_metrics():
    backends = views(2, metrics=[{"llamacpp:requests_deferred": 3.0}, {"llamacpp:requests_deferred": 1.0}])
    policy = create_policy("least-load:signal=llamacpp:requests_deferred")
    assert policy.select(backends, RequestInfo()).index == 1
