from __future__ import annotations

from policies.routing import RequestInfo, create_policy
from tests.policies.routing.harness import views

LONG = "You are a careful assistant. " * 20  # 580 characters, 9 full blocks


def decide(backends, request=None, spec="weighted"):
    d = create_policy(spec).select(backends, request or RequestInfo())
    return d.index, d.rule


def test_equal_backends_tie_to_the_lowest_index():
    assert decide(views(3)) == (0, "tie")


def test_queue_and_kv_scorers_prefer_the_emptier_backend():
    assert decide(views(3, in_flight=[2, 0, 1])) == (1, "queue")
    assert decide(views(2, kv_cache_usage=[0.9, 0.1])) == (1, "kv-cache")
    # queue: 2*(0, 1) ; kv: 2*(0.9, 0.2): 1.8 against 2.4.
    assert decide(views(2, in_flight=[1, 0], kv_cache_usage=[0.1, 0.8])) == (1, "queue")
    assert decide(views(2, in_flight=[1, 0], kv_cache_usage=[0.1, 0.8]), spec="weighted:kv=4") == (0, "kv-cache")


def test_prefix_match_outweighs_a_slightly_longer_queue():
    policy = create_policy("weighted")
    first = policy.select(views(3, in_flight=[1, 1, 0]), RequestInfo(prompt=LONG))
    assert (first.index, first.rule) == (2, "queue")
    # Backend 2: 0 queue + 2 kv + 3 prefix = 5 against 2 + 2 = 4 elsewhere.
    again = policy.select(views(3, in_flight=[0, 0, 1]), RequestInfo(prompt=LONG))
    assert (again.index, again.rule) == (2, "prefix-match")


def test_lora_scorer_prefers_the_backend_running_the_adapter():
    adapters = [frozenset(), frozenset({"sql"}), frozenset()]
    models = [frozenset(), frozenset({"sql"}), frozenset({"sql"})]
    backends = views(3, lora_adapters=adapters, models=models)
    assert decide(backends, RequestInfo(lora="sql")) == (1, "lora")


def test_burst_of_one_prompt_spreads_evenly_once_affinity_yields():
    policy = create_policy("weighted")
    counts = [0] * 8
    for _ in range(200):
        counts[policy.select(views(8, in_flight=counts), RequestInfo(prompt=LONG)).index] += 1
    assert counts == [25] * 8


def test_affinity_yields_only_past_both_the_absolute_and_relative_bound():
    # 5 - 0 > 4 and 5 > 0: no prefix credit, so the shorter queue wins.
    assert prefix_on_backend_1_then([0, 5]) == (0, "queue")
    # 12 - 8 = 4 is within the absolute bound: prefix (3) beats queue (2).
    assert prefix_on_backend_1_then([8, 12]) == (1, "prefix-match")
    # 24 - 18 > 4 but 24 < 1.25 x 20: still within the relative bound.
    assert prefix_on_backend_1_then([20, 24]) == (1, "prefix-match")


def prefix_on_backend_1_then(loads):
    policy = create_policy("weighted")
    policy.select(views(2, in_flight=[1, 0]), RequestInfo(prompt=LONG))
    d = policy.select(views(2, in_flight=loads), RequestInfo(prompt=LONG))
    return d.index, d.rule


def test_the_decision_predicts_the_cached_tokens_of_the_winner():
    policy = create_policy("weighted")
    assert policy.select(views(3, in_flight=[1, 1, 0]), RequestInfo(prompt=LONG)).predicted_cached_tokens == 0
    d = policy.select(views(3, in_flight=[0, 0, 1]), RequestInfo(prompt=LONG))
    assert (d.index, d.predicted_cached_tokens) == (2, 9 * 16)  # the 9 full blocks of 64 characters
